"""Driver-free stand-ins for the ops tests: a device tensor exposing ``__cuda_array_interface__`` and a
``get_kernel`` replacement that records launches and checks each argument list against the committed sm_90a
manifest (count, int/float kind, the divisibility promises of the .a16 variants), and records when each kernel
is loaded (a load while ``is_capturing()`` holds fails: a module load inside a graph capture)."""
from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

MANIFEST = json.loads((Path(__file__).resolve().parents[1] / "manifests/sm_90a.json").read_text())


class Dev:
    """A device tensor stand-in exposing __cuda_array_interface__ (no driver needed)."""
    _next = 1 << 32

    def __init__(self, shape, typestr="<V2", strides=None, offset=0, device_ptr=None):
        isz = int(typestr[2:]) if typestr[1] in "iuf" else 2
        if device_ptr is None:
            device_ptr = Dev._next
            Dev._next += 1 << 28
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (device_ptr + offset * isz, False), "version": 3,
            "strides": None if strides is None else tuple(s * isz for s in strides)}


class Recorder:
    """``declared``: the bases the ops module declares (BASES + OPTIONAL_BASES); asking for any other is a
    test failure (each base name is spelled once, in the module's naming functions)."""

    def __init__(self, occupancy: int = 2, declared=None):
        self.calls = []
        self.scratch = []  # the scratch= of each launch (None: the default)
        self.occupancy = occupancy
        self.declared = None if declared is None else frozenset(declared)
        self.loads = []  # bases in the order they were loaded (first launch, max_active_blocks or load())
        self.is_capturing = lambda: False  # a test's capture state (e.g. the fake driver's)
        self._kernels = {}

    def __call__(self, base, device=None):
        assert self.declared is None or base in self.declared, f"{base} is not among the module's declared bases"
        k = self._kernels.get(base)
        if k is None:
            k = self._kernels[base] = self._make(base)
        return k

    def _make(self, base):
        entry = MANIFEST["kernels"][base]  # KeyError = the op asked for a base that does not exist
        entry_base = base
        rec = self

        class K:
            constexprs = entry["inputs"]["constexprs"]
            device = 0
            base = entry_base
            loaded = False

            def load(self):  # the real Kernel.load: cuModuleLoadData, refused inside a stream capture
                if not self.loaded:
                    assert not rec.is_capturing(), f"{base} is loaded (cuModuleLoadData) inside a graph capture"
                    self.loaded = True
                    rec.loads.append(base)

            def max_active_blocks(self):
                self.load()
                return rec.occupancy

            def scratch_bytes(self, grid):  # global scratch of a launch on grid (the manifest's size per CTA)
                n = 1
                for g in grid:
                    n *= g
                return entry["launch"]["global_scratch_size"] * n

            def launch(self, grid, args, stream=0, scratch=None):
                self.load()
                visible = [p for p in entry["params"] if not p.get("hidden")]
                assert len(args) == len(visible), (base, len(args), [p["name"] for p in visible])
                for p, v in zip(visible, args):
                    if p["type"] == "fp32":
                        assert isinstance(v, float), (base, p["name"], v)
                    else:
                        assert isinstance(v, int), (base, p["name"], v)
                    if p.get("divisibility"):
                        assert v % 16 == 0, (base, p["name"], v)  # the .a16 promise holds
                rec.calls.append((base, tuple(grid), tuple(args)))
                rec.scratch.append(scratch)
        return K()

    def has(self, base, device=None):
        return base in MANIFEST["kernels"]


def declared_bases(ops_module) -> frozenset:
    return frozenset(ops_module.BASES) | frozenset(getattr(ops_module, "OPTIONAL_BASES", ()))


def _modules(ops_module) -> list:
    """An ops module, and every submodule when it is a package (vkc_runtime.ops.attn)."""
    mods = [ops_module]
    for info in pkgutil.iter_modules(getattr(ops_module, "__path__", [])):
        mods.append(importlib.import_module(f"{ops_module.__name__}.{info.name}"))
    return mods


def patch_ops(monkeypatch, ops_module, name: str, value) -> None:
    """Set ``name`` to ``value`` wherever the ops module (or, for a package, one of its submodules) holds it:
    a function the package's modules import from each other (``get_kernel``, ``cache_pair``, ...) is replaced
    in each of them. Refuses a name that none holds (a test patching nothing)."""
    hit = False
    for m in _modules(ops_module):
        if hasattr(m, name):
            monkeypatch.setattr(m, name, value)
            hit = True
    assert hit, f"no module of {ops_module.__name__} has {name!r}"


def install_recorder(monkeypatch, ops_module, occupancy: int = 2) -> Recorder:
    """Route an ops module's kernel lookups to a Recorder (and pin its SM count to the H200's 132)."""
    r = Recorder(occupancy=occupancy, declared=declared_bases(ops_module))
    patch_ops(monkeypatch, ops_module, "get_kernel", r)
    for name, value in (("has_kernel", r.has), ("_sm_count", lambda dev: 132)):
        if any(hasattr(m, name) for m in _modules(ops_module)):
            patch_ops(monkeypatch, ops_module, name, value)
    return r


class TorchLike:
    """A torch-like CUDA tensor stand-in (data_ptr / shape / stride() / dtype / is_cuda / get_device), the kind of
    input a bound call guards on (vkc_runtime.bound.bind_call); dtype is a torch-style name ("torch.bfloat16")."""
    _next = 1 << 36

    def __init__(self, shape, dtype="torch.bfloat16", strides=None, offset_bytes=0, device=0, is_cuda=True):
        if strides is None:
            strides, acc = [], 1
            for d in reversed(shape):
                strides.insert(0, acc)
                acc *= max(d, 1)
        self.shape, self._strides, self.dtype = tuple(shape), tuple(strides), DTYPES[dtype]
        self.is_cuda, self._device = is_cuda, device
        self._ptr = TorchLike._next + offset_bytes
        TorchLike._next += 1 << 28

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device if self.is_cuda else -1


DTYPES = {n: n for n in ("torch.bfloat16", "torch.int32", "torch.float32", "torch.float16")}  # one object per name
