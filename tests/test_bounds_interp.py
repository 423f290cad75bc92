"""Memory safety of device-side indices on CPU (issue 12): every op that reads an index from device memory,
called through its vkc_runtime.ops wrapper (validation, argument lists and grids as on the GPU) with the
kernels run by Triton's interpreter (TRITON_INTERPRET=1, tests/conftest.py) on the sm_90a specs.

Two independent checks per launch: (1) every address a kernel loads, stores or updates atomically -- under a
mask, through a tensor descriptor or plain -- must lie inside one of the tensors the test handed the op
(checked before the access is made, so a bad index fails the test instead of touching memory); (2) those
tensors are views into larger buffers whose sentinel bytes must survive (tests/bounds_cases.py, which also
holds the cases and the semantics checked)."""
from __future__ import annotations

import contextlib
import importlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

from tests import bounds_cases as B  # noqa: E402
from tests.kernel_testing import interpreter_active, specs  # noqa: E402

ARCH = "sm_90a"
_TORCH = {"*bf16": torch.bfloat16, "*fp32": torch.float32, "*i32": torch.int32, "*i64": torch.int64,
          "*fp16": torch.float16, "*u8": torch.uint8, "*fp8e4nv": torch.float8_e4m3fn}
_TYPESTR = {torch.bfloat16: "<V2", torch.float32: "<f4", torch.int32: "<i4", torch.float16: "<f2", torch.uint8: "|u1",
            torch.int8: "|i1", torch.float64: "<f8"}


def test_interpreter_is_active():
    assert interpreter_active(), "TRITON_INTERPRET=1 must be set before triton is imported (tests/conftest.py)"


# -------------------------------------------------------------------------------------- address checking

def _merge(ranges):
    out = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1]:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    return np.array([r[0] for r in out], dtype=np.uint64), np.array([r[1] for r in out], dtype=np.uint64)


@contextlib.contextmanager
def only_touching(ranges, what: str):
    """Fail on any interpreter memory access (element bytes under a true mask) outside ``ranges``."""
    from triton.runtime import interpreter as I

    los, his = _merge(ranges)

    def check(ptrs, mask, kind):
        p = np.asarray(ptrs.data).astype(np.uint64)
        m = np.broadcast_to(np.asarray(mask.data, dtype=bool), p.shape) if mask is not None else np.ones(p.shape, bool)
        a = p[m]
        if a.size == 0:
            return
        isz = np.uint64(ptrs.get_element_ty().primitive_bitwidth // 8)
        i = np.searchsorted(los, a, side="right").astype(np.int64) - 1
        ok = (i >= 0) & (a + isz <= his[np.maximum(i, 0)])
        if not ok.all():
            bad = [hex(int(x)) for x in a[~ok][:4]]
            raise AssertionError(f"{what}: {kind} outside the op's tensors at {bad} ({int((~ok).sum())} elements)")

    B_ = I.InterpreterBuilder
    orig = {n: getattr(B_, n) for n in ("create_masked_load", "create_masked_store", "create_atomic_rmw",
                                         "create_atomic_cas")}

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        check(ptrs, mask, "load")
        return orig["create_masked_load"](self, ptrs, mask, other, cache_policy, is_volatile)

    def store(self, ptrs, value, mask, cache_policy):
        check(ptrs, mask, "store")
        return orig["create_masked_store"](self, ptrs, value, mask, cache_policy)

    def rmw(self, op, ptr, val, mask, sem, scope):
        check(ptr, mask, "atomic")
        return orig["create_atomic_rmw"](self, op, ptr, val, mask, sem, scope)

    def cas(self, ptr, cmp, val, sem, scope):
        check(ptr, None, "atomic cas")
        return orig["create_atomic_cas"](self, ptr, cmp, val, sem, scope)

    for n, f in (("create_masked_load", load), ("create_masked_store", store), ("create_atomic_rmw", rmw),
                 ("create_atomic_cas", cas)):
        setattr(B_, n, f)
    try:
        yield
    finally:
        for n, f in orig.items():
            setattr(B_, n, f)


def test_address_check_catches_an_out_of_bounds_access():
    """The checker itself: a load one element past a view fails, the same load masked off passes."""
    import triton.language as tl

    @triton.jit
    def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        i = tl.arange(0, BLOCK)
        tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n, other=0.0), mask=i < 8)

    ar = B.Arena(1, "cpu")
    x, y = ar.put(torch.randn(8)), ar.poison((8,), torch.float32)
    with only_touching(ar.ranges(), "probe"):
        k[(1,)](x, y, 8, BLOCK=16)
    assert torch.equal(x, y)
    with pytest.raises(Exception, match="outside the op's tensors"), only_touching(ar.ranges(), "probe"):
        k[(1,)](x, y, 9, BLOCK=16)


def test_arena_detects_a_sentinel_write():
    ar = B.Arena(2, "cpu")
    x = ar.put(torch.randn(4, 8))
    ar.check()
    x.view(-1).as_strided((1,), (1,), x.storage_offset() + 32).fill_(1.0)  # the first element past the view
    with pytest.raises(AssertionError, match="after a 128-byte view"):
        ar.check()


# ------------------------------------------------------------------------------ ops on the interpreter

class Cai:
    """A CPU torch view handed to an op as a __cuda_array_interface__ producer (device unknown, -1)."""

    def __init__(self, t: torch.Tensor):
        isz = t.element_size()
        self.__cuda_array_interface__ = {"shape": tuple(t.shape), "typestr": _TYPESTR[t.dtype],
                                         "data": (t.data_ptr(), False), "version": 3,
                                         "strides": tuple(s * isz for s in t.stride())}


class InterpKernel:
    """What an op gets from get_kernel: the spec's constexprs for ARCH, and launch() running the kernel in the
    interpreter on the test's buffers (pointer arguments resolved to views of them), every access checked."""

    device = 0

    def __init__(self, base: str, spec):
        self.base, self.spec, self.cfg = base, spec, spec.for_arch(ARCH)
        self.constexprs = dict(self.cfg.constexprs)
        self.fn = getattr(importlib.import_module(f"kernels_src.{spec.family}.{spec.source[:-3]}"), spec.entry)

    def max_active_blocks(self) -> int:
        return 2

    def load(self) -> None:  # the interpreter needs no module
        pass

    def launch(self, grid, args, stream=0):
        assert len(args) == len(self.spec.args), (self.base, len(args))
        arenas = list(B.ACTIVE)
        conv = []
        for a, v in zip(self.spec.args, args):
            if a.type.startswith("*"):
                conv.append(next(ar.view_at(v, _TORCH[a.type]) for ar in arenas if ar.owns(v)))
            else:
                assert isinstance(v, float if a.type.startswith("fp") else int), (self.base, a.name, v)
                conv.append(v)
        with only_touching([r for ar in arenas for r in ar.ranges()], self.base):
            self.fn[tuple(grid)](*conv, **self.constexprs, num_warps=self.cfg.num_warps, num_stages=self.cfg.num_stages)


class InterpRegistry:
    def __init__(self):
        self.specs = {f: specs(f) for f in ("attn", "gdn", "gdn_decode", "conv", "norm", "rope", "act", "embedding")}
        self.launched = []

    def __call__(self, base: str, device=None) -> InterpKernel:
        fam, name = base.split(".", 1)
        spec = self.specs[fam][name]
        assert ARCH in spec.archs, base
        self.launched.append(base)
        return InterpKernel(base, spec)

    def has(self, base: str, device=None) -> bool:
        fam, name = base.split(".", 1)
        s = self.specs.get(fam, {}).get(name)
        return s is not None and ARCH in s.archs


@pytest.fixture()
def ops(monkeypatch):
    """The ops modules with kernels routed to the interpreter; yields (namespace of modules, Env)."""
    from types import SimpleNamespace

    from tests.ops_fakes import patch_ops
    from vkc_runtime.ops import act, attn, conv, embedding, gdn, gdn_decode, norm, rope

    reg = InterpRegistry()
    mods = SimpleNamespace(A=attn, G=gdn, GD=gdn_decode, CV=conv, NM=norm, RO=rope, AC=act, EM=embedding, reg=reg)
    for m in (act, attn, conv, embedding, gdn, gdn_decode, norm, rope):
        patch_ops(monkeypatch, m, "get_kernel", reg)
    patch_ops(monkeypatch, attn, "has_kernel", reg.has)
    patch_ops(monkeypatch, attn, "_sm_count", lambda dev: 132)
    B.ACTIVE.clear()
    yield mods, B.Env("cpu", wrap=Cai)
    B.ACTIVE.clear()


# ------------------------------------------------------------------------------------------------ tests

@pytest.mark.parametrize("case", list(B.PREFILL_CU))
@pytest.mark.parametrize("use_tma", [False, True])
def test_prefill_cu_seqlens(ops, case, use_tma):
    m, env = ops
    B.check_prefill(env, m.A, case, use_tma, small_grid=case in ("valid", "past_end", "decreasing", "huge_hi"))
    assert m.reg.launched[-1] == "attn.prefill.d256.gate" + (".tma" if use_tma else "")


@pytest.mark.parametrize("use_tma", [False, True])
def test_prefill_bad_lengths_and_tables(ops, use_tma):
    m, env = ops
    B.check_prefill_bad_lengths(env, m.A, use_tma)


@pytest.mark.parametrize("splits,fused", [(1, False), (3, False), (3, True)])
def test_decode_bad_lengths_and_tables(ops, splits, fused):
    m, env = ops
    B.check_decode(env, m.A, splits, fused)
    want = {1: "attn.decode_direct", 3: "attn.decode_fused" if fused else "attn.decode_combine"}[splits]
    assert m.reg.launched[-1].startswith(want)


def test_reshape_and_cache_slots(ops):
    m, env = ops
    B.check_reshape_and_cache(env, m.A)


@pytest.mark.parametrize("case", list(B.GDN_CASES))
def test_gdn_prefill_cu_seqlens_and_slots(ops, case):
    m, env = ops
    B.check_gdn(env, m.G, case)


def test_gdn_decode_slots(ops):
    m, env = ops
    B.check_gdn_decode(env, m.GD)


@pytest.mark.parametrize("case", list(B.CONV_CASES))
def test_conv_prefill_cu_seqlens_and_slots(ops, case):
    m, env = ops
    B.check_conv(env, m.CV, case)


@pytest.mark.parametrize("case", ["past_end", "negative"])
def test_conv_prefill_unaligned_channels(ops, case):
    """C % 16 != 0: the .any variant (its own masks)."""
    m, env = ops
    B.check_conv(env, m.CV, case, C=40)
    assert m.reg.launched[-2:] == ["conv.prefill.w4.any", "conv.heads.w4.any"]


def test_conv_prefill_aligned_rows_unaligned_channels(ops):
    """C % 16 != 0 in rows of 16-element multiples: the heads take .a16, the body .any (its .a16 form is compiled
    for C % 16 == 0 only)."""
    m, env = ops
    B.check_conv(env, m.CV, "past_end", C=40, pad=8)
    assert m.reg.launched[-2:] == ["conv.prefill.w4.any", "conv.heads.w4.a16"]


def test_conv_update_slots(ops):
    m, env = ops
    B.check_conv_update(env, m.CV)


def test_embedding_ids(ops):
    m, env = ops
    B.check_embedding(env, m.EM)


def test_rope_positions(ops):
    m, env = ops
    B.check_rope_positions(env, m.RO)
