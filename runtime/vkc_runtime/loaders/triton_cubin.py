"""The ``triton-cubin`` loader: :class:`Kernel`, one Triton cubin of one arch in one CUDA context.

The cubin is loaded lazily on the first launch, after its sha256 was checked against the manifest
(:meth:`vkc_runtime.artifacts.ArtifactSet.read_verified`). :meth:`Kernel.launch` ``(grid, args, stream,
scratch=None)``: ``args`` are the kernel's *visible* parameters in declaration order (pointers as ints,
scalars as ints/floats); vkc appends the two hidden scratch pointers, the global one from ``scratch`` (a
:class:`vkc_runtime.scratch.GlobalScratch` of the caller's workspace) or, without one, from the context's
default :class:`vkc_runtime.scratch.ScratchArena`. The launcher is the native one
(``vkc_runtime._native.Launcher``) unless :func:`vkc_runtime.native.native_available` says no, then
:class:`vkc_runtime.pack.PyLauncher`.
"""
from __future__ import annotations

import os
import threading
from typing import Any

from .. import driver, scratch as _scratch
from ..artifacts import ArtifactSet, LaunchSpec
from ..errors import ArtifactError, LaunchError
from ..native import NATIVE, native_available
from ..pack import PyLauncher, check_grid, grid3

__all__ = ["Kernel", "SMEM_DEFAULT_LIMIT"]

SMEM_DEFAULT_LIMIT = 48 * 1024  # above this a kernel must opt in (cuFuncSetAttribute)


class Kernel:
    """One compiled base (a cubin of one arch) in one CUDA context."""

    def __init__(self, base: str, spec: LaunchSpec, aset: ArtifactSet, ctx: int, device: int = 0):
        self.base = base
        self.spec = spec
        self.artifacts = aset
        entry = aset.kernels.get(base, {})
        self.inputs: dict[str, Any] = dict(entry.get("inputs") or {})  # the manifest's compile inputs
        self.constexprs: dict[str, Any] = dict(self.inputs.get("constexprs") or {})  # e.g. BLOCK, baked in
        self.arch = aset.arch
        self.ctx = ctx
        self.device = device
        self.module = None
        self.function = None
        self.native = False
        self._launcher = None
        self._scratch_size = spec.global_scratch_size
        self._occupancy: int | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        state = "loaded" if self._launcher is not None else "not loaded"
        return f"<vkc Kernel {self.base} {self.arch} ctx={self.ctx:#x} {state}>"

    @property
    def param_names(self) -> list[str]:
        return [p["name"] for p in self.spec.visible]

    @property
    def n_args(self) -> int:
        return self.spec.n_visible

    @property
    def loaded(self) -> bool:
        return self._launcher is not None

    # -- loading ----------------------------------------------------------------------------------
    def load(self):
        """Check sha256, ``cuModuleLoadData``, get the function, set attributes, build the launcher."""
        if self._launcher is not None:
            return self._launcher
        with self._lock:
            if self._launcher is not None:
                return self._launcher
            spec = self.spec
            if spec.profile_scratch_size > 0:
                raise ArtifactError(f"{self.base}: profile_scratch_size={spec.profile_scratch_size} (proton "
                                    f"instrumentation) is not supported by vkc_runtime; rebuild without it")
            path = self.artifacts.path(self.base)
            if path.suffix != ".cubin":
                raise ArtifactError(f"{self.base}: {path.name} is not a .cubin; the triton-cubin loader loads "
                                    f"Triton cubins only")
            data = self.artifacts.read_verified(self.base)  # IntegrityError before the driver sees the bytes
            cu = driver.cu
            pushed = False
            if driver.current_context() != self.ctx:
                driver.call(cu.cuCtxPushCurrent, self.ctx)
                pushed = True
            try:
                self.module = driver.call_taking_memory(cu.cuModuleLoadData, data, detail=f"loading {path}")
                fn = driver.call(cu.cuModuleGetFunction, self.module, spec.name.encode(),
                                 detail=f"entry {spec.name!r} in {path}")
                self._configure(fn)
                self.function = fn
                self._launcher = self._make_launcher(fn)
            finally:
                if pushed:
                    driver.call(cu.cuCtxPopCurrent)
            return self._launcher

    def _configure(self, fn) -> None:
        cu = driver.cu
        FA = cu.CUfunction_attribute
        spec = self.spec
        max_threads = int(driver.call(cu.cuFuncGetAttribute, FA.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn))
        if max_threads < spec.block_x:
            raise LaunchError(f"{self.base}: needs {spec.block_x} threads per block (num_warps={spec.num_warps}) but "
                              f"the loaded function allows {max_threads} (too many registers for this device?)")
        if spec.num_ctas > 1:
            cc = driver.device_cc(self.device)
            if cc[0] < 9:
                raise LaunchError(f"{self.base}: num_ctas={spec.num_ctas} needs thread-block clusters (sm_90+), "
                                  f"device cc is {cc[0]}.{cc[1]}")
            if spec.num_ctas > 8:
                driver.call(cu.cuFuncSetAttribute, fn, FA.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1)
        if spec.shared > SMEM_DEFAULT_LIMIT:
            optin = driver.max_smem_optin(self.device)
            static = int(driver.call(cu.cuFuncGetAttribute, FA.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn))
            if spec.shared + static > optin:
                raise LaunchError(
                    f"{self.base} ({self.arch}): needs {spec.shared} bytes of dynamic shared memory (+{static} static) "
                    f"per block, device {self.device} allows at most {optin} (MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)")
            driver.call(cu.cuFuncSetAttribute, fn, FA.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, spec.shared,
                        detail=f"{self.base}: opting into {spec.shared} bytes of dynamic shared memory")

    def _make_launcher(self, fn):
        spec = self.spec
        # VKC_PDL=0 launches the PDL kernels without the attribute: plain stream order, their wait a no-op (A/B)
        pdl = spec.launch_pdl and os.environ.get("VKC_PDL", "1").strip() != "0"
        args = (spec.codes, list(spec.names), list(spec.divisibility), len(spec.hidden), spec.block_x, spec.shared,
                spec.num_ctas, pdl, spec.launch_cooperative_grid, self.base)
        if native_available():
            self.native = True
            return NATIVE.Launcher(int(fn), *args)
        self.native = False
        return PyLauncher(fn, *args)

    def max_active_blocks(self) -> int:
        """Resident CTAs per SM (cuOccupancyMaxActiveBlocksPerMultiprocessor with the launch's block size
        and dynamic shared memory): the wave size of a grid is this times the SM count. Cached."""
        n = self._occupancy
        if n is None:
            self.load()
            n = int(driver.call(driver.cu.cuOccupancyMaxActiveBlocksPerMultiprocessor, self.function,
                                self.spec.block_x, self.spec.shared, detail=f"occupancy of {self.base}"))
            self._occupancy = n
        return n

    # -- launching --------------------------------------------------------------------------------
    @property
    def scratch_size(self) -> int:
        """Bytes of global scratch per CTA (0: the kernel needs none)."""
        return self._scratch_size

    def scratch_bytes(self, grid) -> int:
        """Global scratch a launch on ``grid`` needs (0 for most kernels): size a workspace with it."""
        if not self._scratch_size:
            return 0
        gx, gy, gz = grid3(self.base, grid)
        return _scratch.scratch_nbytes(gx, gy, gz, self.spec.num_ctas, self._scratch_size)

    def launch(self, grid, args, stream=0, scratch=None) -> None:
        """Launch on ``grid`` (int or 1-3 ints) with the visible ``args`` on ``stream`` (int handle or
        anything :func:`vkc_runtime.stream.resolve_stream` accepts; default: legacy stream 0). ``scratch``: a
        :class:`~vkc_runtime.scratch.GlobalScratch` for a kernel that needs global scratch (None: the
        context's default arena); ignored by kernels that need none."""
        lau = self._launcher
        if lau is None:
            lau = self.load()
        if type(grid) is tuple and len(grid) == 3:
            gx, gy, gz = grid
        elif type(grid) is int:
            gx, gy, gz = grid, 1, 1
        else:
            gx, gy, gz = grid3(self.base, grid)
        if type(stream) is not int:
            from ..stream import resolve_stream
            stream = resolve_stream(stream)
        if type(args) is not tuple:
            args = tuple(args)
        sp = self._scratch_ptr(gx, gy, gz, stream, scratch) if self._scratch_size else 0
        lau.launch(gx, gy, gz, stream, args, sp)

    __call__ = launch

    def bind(self, grid, stream: int, scratch=None):
        """What a launch on ``grid`` resolves to before its arguments: (launcher, gx, gy, gz, scratch pointer)
        -- :func:`vkc_runtime.bound.bind_call` packs the arguments once and replays it."""
        lau = self._launcher or self.load()
        gx, gy, gz = grid3(self.base, grid)
        check_grid(self.base, gx, gy, gz, self.spec.num_ctas)
        return lau, gx, gy, gz, self._scratch_ptr(gx, gy, gz, stream, scratch)

    def _scratch_ptr(self, gx: int, gy: int, gz: int, stream: int, scratch) -> int:
        """The global-scratch pointer of a launch on this grid (0: the kernel needs none / empty grid), from
        ``scratch`` or the context's default arena -- never from a per-stream pool."""
        if not self._scratch_size or gx <= 0 or gy <= 0 or gz <= 0:
            return 0
        check_grid(self.base, gx, gy, gz, self.spec.num_ctas)
        n = _scratch.scratch_nbytes(gx, gy, gz, self.spec.num_ctas, self._scratch_size)
        src = scratch if scratch is not None else _scratch.arena(self.ctx)
        return src.get(n, self.spec.global_scratch_align, stream, what=self.base)
