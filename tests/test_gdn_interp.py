"""CPU tests of kernels_src/gdn (chunked gated-delta-rule prefill) through Triton's interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py) against the float64 references of tests/refs_gdn.py.

The five kernels are launched exactly as runtime/vkc_runtime/ops/gdn.py launches them (positional runtime
args in spec order, constexprs from the spec, the same grids and workspace shapes); outputs, states and every
scratch buffer are poisoned with NaN first.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tests.kernel_testing import device, interpreter_active, launch_spec, np64, specs  # noqa: E402
from tests import refs_gdn  # noqa: E402

FAMILY_DIR = os.path.join(ROOT, "kernels_src", "gdn")
DK = DV = 128
BT = 64




INTERP = interpreter_active()


DEV = device()




@pytest.fixture(scope="module")
def K():
    mod = importlib.import_module("kernels_src.gdn.chunk")
    return SimpleNamespace(mod=mod, specs=specs("gdn"))


def launch(K, name, grid, *args, arch="sm_90a", **override):
    return launch_spec(K.specs[name], grid, *args, arch=arch, **override)


def run_chunked(K, qkv, a, b, A_log, dt_bias, cu, hk, hv, state=None, slot_idx=None, max_chunks=None,
                arch="sm_90a", delta_h=None):
    """The op's launch sequence (runtime/vkc_runtime/ops/gdn.py) on torch tensors. Returns (o, scratch dict).
    ``delta_h``: constexprs overriding the delta_h spec's (e.g. the other state orientation)."""
    T = qkv.shape[0]
    N = cu.shape[0] - 1
    mc = max_chunks if max_chunks is not None else T // BT + N
    nan = float("nan")
    f = dict(device=DEV)
    ws = dict(
        seqinfo=torch.full((N, 4), -7, dtype=torch.int32, **f),
        cidx=torch.full((mc, 2), -7, dtype=torch.int32, **f),
        qn=torch.full((T, hk, DK), nan, dtype=torch.bfloat16, **f),
        kn=torch.full((T, hk, DK), nan, dtype=torch.bfloat16, **f),
        g=torch.full((T, hv), nan, dtype=torch.float32, **f),
        beta=torch.full((T, hv), nan, dtype=torch.float32, **f),
        w=torch.full((T, hv, DK), nan, dtype=torch.bfloat16, **f),
        u=torch.full((T, hv, DV), nan, dtype=torch.bfloat16, **f),
        h=torch.full((mc, hv, DK, DV), nan, dtype=torch.bfloat16, **f),
    )
    o = torch.full((T, hv, DV), nan, dtype=torch.bfloat16, **f)
    num_slots = state.shape[0] if state is not None else 0
    st = state if state is not None else torch.empty(1, dtype=torch.float32, **f)
    sl = slot_idx if slot_idx is not None else torch.empty(1, dtype=torch.int32, **f)
    sq = qkv.stride(0)
    launch(K, "chunk_index", (1,), cu, ws["seqinfo"], ws["cidx"], N, T, mc, arch=arch)
    launch(K, "prep", (mc, hk), qkv, a, b, A_log, dt_bias, ws["cidx"], ws["qn"], ws["kn"], ws["g"], ws["beta"],
           sq, a.stride(0), b.stride(0), hk, hv, arch=arch)
    v = qkv[:, 2 * hk * DK:]
    launch(K, "kkt_wy", (mc * hv,), ws["kn"], v, ws["g"], ws["beta"], ws["cidx"], ws["w"], ws["u"], sq, hk, hv,
           arch=arch)
    dh = {**K.specs["delta_h"].for_arch(arch).constexprs, **(delta_h or {})}
    launch(K, "delta_h", (N, hv, DV // dh["BV"]), ws["kn"], ws["w"], ws["u"], ws["g"], ws["h"], st, sl,
           ws["seqinfo"], hk, hv, num_slots, arch=arch, **(delta_h or {}))
    bvo = K.specs["chunk_o"].for_arch(arch).constexprs["BV"]
    launch(K, "chunk_o", (mc * hv * (DV // bvo),), ws["qn"], ws["kn"], ws["u"], ws["g"], ws["h"], ws["cidx"], o,
           hk, hv, DK ** -0.5, arch=arch)
    return o, ws




def make_inputs(seed, lens, hk, hv, gate="normal"):
    g = torch.Generator().manual_seed(seed)
    T = sum(lens)
    C = 2 * hk * DK + hv * DV
    qkv = torch.randn(T, C, generator=g).to(torch.bfloat16)
    a = (torch.randn(T, hv, generator=g) * 2.0).to(torch.bfloat16)
    b = (torch.randn(T, hv, generator=g) * 2.0).to(torch.bfloat16)
    A_log = torch.rand(hv, generator=g) * 2.0 - 1.0
    dt_bias = torch.randn(hv, generator=g) * 0.5
    if gate == "extreme":
        # heads 0/1: gates ~ -1e3 (state wiped each token), head 2: g ~ 0 (no decay), heads 3+: beta ~ 1
        A_log[0] = 6.0
        a[:, 0] = 30.0
        A_log[1] = 3.0
        a[:, 1] = 10.0
        A_log[2] = -20.0
        a[:, 2] = -30.0
        b[:, 3:] = 20.0
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]).astype(np.int32))
    return [t.to(DEV) for t in (qkv, a, b, A_log.float(), dt_bias.float(), cu)]


def check(out, ref, tol, what):
    o = np64(out) if isinstance(out, torch.Tensor) else out
    assert np.isfinite(o).all(), f"{what}: {np.count_nonzero(~np.isfinite(o))} non-finite values"
    err = refs_gdn.rel_err(o, ref)
    assert err < tol, f"{what}: relative error {err:.3e} >= {tol}"
    return err


# ------------------------------------------------------------------------------------------------- tests

def test_reference_chunked_equals_recurrent():
    rng = np.random.default_rng(0)
    hk, hv, dk = 1, 2, 8
    lens = [1, 5, 9, 16]
    T = sum(lens)
    qkv = rng.standard_normal((T, 2 * hk * dk + hv * dk))
    a, b = rng.standard_normal((T, hv)), rng.standard_normal((T, hv))
    A_log, dt = rng.standard_normal(hv), rng.standard_normal(hv)
    cu = np.concatenate([[0], np.cumsum(lens)])
    st = rng.standard_normal((3, hv, dk, dk))
    sl = np.array([2, -1, 0, 1])
    o1, s1 = refs_gdn.recurrent(qkv, a, b, A_log, dt, cu, hk, hv, st, sl, dk, dk)
    o2, s2 = refs_gdn.chunked(qkv, a, b, A_log, dt, cu, hk, hv, st, sl, dk, dk, C=4)
    assert np.max(np.abs(o1 - o2)) < 1e-10 and np.max(np.abs(s1 - s2)) < 1e-10


def test_chunk_index(K):
    cu = torch.tensor([0, 1, 1, 65, 130, 200], dtype=torch.int32, device=DEV)
    N, T, mc = 5, 200, 200 // 64 + 5
    si = torch.full((N, 4), -7, dtype=torch.int32, device=DEV)
    ci = torch.full((mc, 2), -7, dtype=torch.int32, device=DEV)
    launch(K, "chunk_index", (1,), cu, si, ci, N, T, mc)
    assert si.cpu().tolist() == [[0, 1, 0, 1], [1, 1, 1, 0], [1, 65, 1, 1], [65, 130, 2, 2], [130, 200, 4, 2]]
    assert ci.cpu().tolist() == [[0, 1], [1, 65], [65, 130], [129, 130], [130, 200], [194, 200], [-1, -1],
                                 [-1, -1]]


# (token, scale of its q and k channels): sum(x^2) over a head = 128 s^2 from 1.3e-6 to 1.2e-3, where the
# L2 norm's eps (1e-6 inside the sqrt) is a visible part of the norm
SMALL_QK_ROWS = ((0, 1e-4), (1, 3e-4), (2, 1e-3), (3, 3e-3), (40, 1e-4), (41, 3e-4))


def rows_check(out, ref, tol, what):
    """Relative error of every [.., K] row on its own (tiny-norm rows cannot hide behind the others)."""
    o = np64(out).reshape(-1, out.shape[-1])
    r = np.asarray(ref, dtype=np.float64).reshape(-1, out.shape[-1])
    assert np.isfinite(o).all(), f"{what}: non-finite values"
    err = np.linalg.norm(o - r, axis=1) / np.maximum(np.linalg.norm(r, axis=1), 1e-30)
    assert err.max() < tol, f"{what}: row {int(err.argmax())} relative error {err.max():.3e} >= {tol}"


def test_prep(K):
    hk, hv = 2, 4
    qkv, a, b, A_log, dt, cu = make_inputs(1, [5, 70], hk, hv)
    for t, sc in SMALL_QK_ROWS:
        qkv[t, :2 * hk * DK] = (qkv[t, :2 * hk * DK].float() * sc).to(torch.bfloat16)
    _, ws = run_chunked(K, qkv, a, b, A_log, dt, cu, hk, hv)
    q, k, v, g, beta = refs_gdn.prep(np64(qkv), np64(a), np64(b), np64(A_log), np64(dt), hk, hv)
    check(ws["qn"], q, 5e-3, "q")
    check(ws["kn"], k, 5e-3, "k")
    rows_check(ws["qn"], q, 1e-2, "q rows")
    rows_check(ws["kn"], k, 1e-2, "k rows")
    # the inputs make the eps visible: 1e-5 instead of 1e-6 moves some row by far more than the tolerance
    x = np64(qkv)[:, :hk * DK].reshape(-1, hk, DK)
    q10 = x / np.sqrt((x * x).sum(-1, keepdims=True) + 1e-5)
    assert np.max(np.linalg.norm(q10 - q, axis=-1) / np.linalg.norm(q, axis=-1)) > 0.1
    assert np.allclose(np64(ws["beta"]), beta, rtol=1e-5, atol=1e-6)
    gc = np.concatenate([np.cumsum(g[s:e], 0) for s, e in ((0, 5), (5, 69), (69, 75))])
    assert np.allclose(np64(ws["g"]), gc, rtol=1e-4, atol=1e-4)


LENS = [1, 5, 63, 64, 65, 130]


@pytest.mark.parametrize("with_state,delta_h", [
    (False, None), (True, None),
    (True, {"TMA": False, "BV": 16}),   # S^T in registers, mma.sync
    (True, {"TMA": True, "BV": 16}),    # S [K, BV], warpgroup MMAs, per-sequence tensor descriptors
])
def test_chunked_prefill_varlen_grouped(K, with_state, delta_h):
    """delta_h: the spec's variant and both paths (BV 16) against the recurrence."""
    hk, hv = 2, 4
    qkv, a, b, A_log, dt, cu = make_inputs(7 + with_state, LENS, hk, hv)
    state = slot = None
    if with_state:
        g = torch.Generator().manual_seed(3)
        state = (torch.randn(8, hv, DK, DV, generator=g) * 0.1).to(DEV)
        slot = torch.tensor([5, -1, 0, 7, 2, 3], dtype=torch.int32, device=DEV)
        state0 = state.clone()
    o, ws = run_chunked(K, qkv, a, b, A_log, dt, cu, hk, hv, state, slot, delta_h=delta_h)
    args = [np64(x) for x in (qkv, a, b, A_log, dt)]
    ro, rs = refs_gdn.recurrent(*args, cu.cpu().numpy(), hk, hv,
                                None if state is None else np64(state0), None if slot is None else slot.cpu().numpy())
    err = check(o, ro, 1e-2, "o")
    print(f"o rel err {err:.3e}")
    if with_state:
        serr = check(state, rs, 1e-2, "state")
        print(f"state rel err {serr:.3e}")
        untouched = [i for i in range(8) if i not in (5, 0, 7, 2, 3)]
        assert torch.equal(state[untouched], state0[untouched]), "slots not in slot_idx were modified"


@pytest.mark.parametrize("delta_h", [{"TMA": False, "BV": 16}, {"TMA": True, "BV": 16}])
def test_empty_sequences_in_batch(K, delta_h):
    """Zero-length sequences between others (delta_h's descriptors then span zero rows / chunks): their
    states come back unchanged, the others match the recurrence."""
    hk, hv = 2, 4
    lens = [5, 0, 70, 0]
    qkv, a, b, A_log, dt, cu = make_inputs(5, lens, hk, hv)
    g = torch.Generator().manual_seed(9)
    state = (torch.randn(4, hv, DK, DV, generator=g) * 0.1).to(DEV)
    state0 = state.clone()
    slot = torch.tensor([2, 0, 3, 1], dtype=torch.int32, device=DEV)
    o, _ = run_chunked(K, qkv, a, b, A_log, dt, cu, hk, hv, state, slot, delta_h=delta_h)
    args = [np64(x) for x in (qkv, a, b, A_log, dt)]
    ro, rs = refs_gdn.recurrent(*args, cu.cpu().numpy(), hk, hv, np64(state0), slot.cpu().numpy())
    check(o, ro, 1e-2, "o")
    check(state, rs, 1e-2, "state")
    assert torch.equal(state[0], state0[0]) and torch.equal(state[1], state0[1]), "an empty sequence's state moved"


def test_extreme_gates_and_tail_chunks(K):
    hk, hv = 1, 6  # 6 value heads per key head: prep takes them in two groups of GP = 4 (one partly masked)
    lens = [64, 3, 129]
    qkv, a, b, A_log, dt, cu = make_inputs(11, lens, hk, hv, gate="extreme")
    # over-sized chunk table (as the runtime sizes it from max tokens / max sequences)
    o, ws = run_chunked(K, qkv, a, b, A_log, dt, cu, hk, hv, max_chunks=sum(lens) // 64 + 3 + 4)
    args = [np64(x) for x in (qkv, a, b, A_log, dt)]
    ro, _ = refs_gdn.recurrent(*args, cu.cpu().numpy(), hk, hv)
    for h in range(hv):
        err = check(o[:, h], ro[:, h], 1e-2, f"o head {h}")
        print(f"head {h}: rel err {err:.3e}")


def test_spec_shapes_archs(K):
    """Every spec names runtime args that exist in the kernel signature, in order."""
    import inspect
    for s in K.specs.values():
        fn = getattr(K.mod, s.entry)
        params = list(inspect.signature(fn.fn if hasattr(fn, "fn") else fn).parameters)
        rt = [p for p in params if p not in s.constexprs]
        assert rt == [a.name for a in s.args], s.name
        for arch in ("sm_80", "sm_86", "sm_90a", "sm_120a"):
            r = s.for_arch(arch)
            assert set(params) - set(rt) == set(r.constexprs), (s.name, arch)


def test_runtime_op_launch_plan(K, monkeypatch):
    """ops.gdn validates, then launches the five bases with exactly the spec's argument count and the grids
    the kernels expect (driver mocked at get_kernel; tensors are fake device pointers)."""
    from vkc_runtime import memory
    from vkc_runtime.ops import gdn as G
    from vkc_runtime.ops._check import OpError

    calls = []

    class FakeKernel:
        def __init__(self, base):
            self.base = base
            self.constexprs = dict(K.specs[base.split(".", 1)[1]].for_arch("sm_90a").constexprs)

        def launch(self, grid, args, stream=0):
            calls.append((self.base, grid, tuple(args)))

    monkeypatch.setattr(G, "get_kernel", lambda base: FakeKernel(base))
    hk, hv, T, N = 16, 48, 300, 3
    ptr = iter(range(1 << 20, 1 << 40, 1 << 28))

    def arr(shape, dt):
        return memory.DeviceArray(shape, dt, ptr=next(ptr), device=0)

    def ws_fake(Tm, S):
        C = G.max_chunks(Tm, S)
        return G.GdnWorkspace(Tm, S, hk, hv, 0, arr((S, 4), "int32"), arr((C, 2), "int32"),
                              arr((Tm, hk, 128), "bfloat16"), arr((Tm, hk, 128), "bfloat16"),
                              arr((Tm, hv), "float32"), arr((Tm, hv), "float32"),
                              arr((Tm, hv, 128), "bfloat16"), arr((Tm, hv, 128), "bfloat16"),
                              arr((C, hv, 128, 128), "bfloat16"), arr((16,), "float32"), arr((4,), "int32"))
    qkv = arr((T, 2 * hk * 128 + hv * 128), "bfloat16")
    a, b = arr((T, hv), "bfloat16"), arr((T, hv), "bfloat16")
    A_log, dt = arr((hv,), "float32"), arr((hv,), "float32")
    cu = arr((N + 1,), "int32")
    state, slot = arr((5, hv, 128, 128), "float32"), arr((N,), "int32")
    out = arr((T, hv, 128), "bfloat16")
    ws = ws_fake(1000, 8)
    G.chunk_gated_delta_rule(qkv, a, b, A_log, dt, cu, hk, hv, state=state, slot_idx=slot, out=out, workspace=ws)
    C = T // 64 + N
    assert [c[0] for c in calls] == list(G.BASES)
    for base, grid, args in calls:
        assert len(args) == len(K.specs[base.split(".", 1)[1]].args), base
    grids = {c[0]: c[1] for c in calls}
    assert grids["gdn.chunk_index"] == (1, 1, 1)
    assert grids["gdn.prep"] == (C, hk, 1)
    assert grids["gdn.kkt_wy"] == (C * hv, 1, 1)
    assert grids["gdn.delta_h"] == (N, hv, 128 // K.specs["delta_h"].for_arch("sm_90a").constexprs["BV"])
    assert grids["gdn.chunk_o"] == (C * hv * (128 // K.specs["chunk_o"].for_arch("sm_90a").constexprs["BV"]), 1, 1)
    assert calls[3][2][-1] == 5 and calls[3][2][5] == state.ptr  # num_slots, state pointer
    # refusals (before any launch)
    calls.clear()
    for kw in (dict(num_v_heads=47), dict(workspace=ws_fake(100, 8)), dict(workspace=ws_fake(1000, 2)),
               dict(state=state), dict(out=arr((T, hv, 64), "bfloat16")), dict(a=arr((T, hv), "float32")),
               dict(qkv=memory.DeviceArray((T, 2 * hk * 128 + hv * 128), "bfloat16", ptr=qkv.ptr + 2, device=0))):
        args = dict(qkv=qkv, a=a, b=b, A_log=A_log, dt_bias=dt, cu_seqlens=cu, num_k_heads=hk, num_v_heads=hv,
                    out=out, workspace=ws)
        args.update(kw)
        with pytest.raises(OpError):
            G.chunk_gated_delta_rule(**args)
    assert not calls
