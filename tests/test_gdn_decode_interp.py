"""CPU tests of kernels_src/gdn_decode (one gated-delta step per sequence, packed qkv input, slot-indexed
fp32 state updated in place) through Triton's interpreter, against the float64 reference in
refs_gdn_decode.py. Hk=2, Hv=4, K=V=128; both specs (BLOCK_V 32 / 16); negative and out-of-range slots
(o = 0, state untouched); poisoned outputs; strided qkv / a / b rows; several steps chained."""
from __future__ import annotations

import importlib
import importlib.util
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from tests.kernel_testing import device, interpreter_active, np64  # noqa: E402
from tests.kernel_testing import specs as load_specs  # noqa: E402
from tests import refs_gdn_decode as R  # noqa: E402
from tests.refs import rel_err  # noqa: E402




INTERP = interpreter_active()
DEV = device()
KD = VD = 128
EPS = 1e-6


@pytest.fixture(scope="module", name="specs")
def specs_fixture():
    return load_specs("gdn_decode")


@pytest.fixture(scope="module")
def kmod():
    return importlib.import_module("kernels_src.gdn_decode.decode")




def step(kmod, spec, qkv, a, b, A_log, dt_bias, state, slots, o, hk, hv, eps=EPS, H=0):
    """One launch; the .ba specs take x for ``a`` and w_ba for ``b`` with H their columns."""
    B = qkv.shape[0]
    s = spec.constexprs
    grid = (B * hv * (s["V"] // s["BLOCK_V"]),)
    args = (qkv, a, b, A_log, dt_bias, state, slots, o, qkv.stride(0), a.stride(0), b.stride(0), state.stride(0),
            o.stride(0), hk, hv, state.shape[0], KD ** -0.5, eps, H)
    assert len(args) == len(spec.args)
    getattr(kmod, spec.entry)[grid](*args, **s, num_warps=spec.num_warps, num_stages=spec.num_stages)


def inputs(seed, B, hk, hv, nslots, pad=0):
    g = torch.Generator().manual_seed(seed)
    Cq = 2 * hk * KD + hv * VD
    qkv = (torch.randn(B, Cq + pad, generator=g) * 2.0).to(torch.bfloat16)[:, :Cq]
    ab = (torch.randn(B, 2 * hv + 3, generator=g) * 2.0).to(torch.bfloat16)
    a, b = ab[:, :hv], ab[:, hv + 3:]
    A_log = torch.rand(hv, generator=g) * 2.0 - 1.0
    dt_bias = torch.randn(hv, generator=g) * 0.5
    state = torch.randn(nslots, hv, KD, VD, generator=g) * 0.3
    return qkv, a, b, A_log, dt_bias, state


def shrink_qk(qkv, hk, row, scales):
    """Scale q head i and k head i of batch row ``row`` by scales[i] and scales[hk + i]: sum(x^2) of a head
    ~ 128 (2 s)^2, where the L2 norm's eps is a visible part of the norm."""
    for j, sc in enumerate(scales):
        sl = slice(j * KD, (j + 1) * KD)
        qkv[row, sl] = (qkv[row, sl].float() * sc).to(torch.bfloat16)


def rows_close(o, ref, tol, what):
    """Every [V] output row (b, h) on its own."""
    o = o.reshape(-1, o.shape[-1])
    r = np.asarray(ref).reshape(-1, o.shape[-1])
    n = np.linalg.norm(r, axis=1)
    live = n > 0
    err = np.linalg.norm(o - r, axis=1)[live] / n[live]
    assert err.max() < tol, f"{what}: row relative error {err.max():.3e} >= {tol}"


@pytest.mark.parametrize("eps", [EPS, 1e-5])
@pytest.mark.parametrize("name", ["recurrent.k128_v128.bv32", "recurrent.k128_v128.bv16"])
def test_decode_step(specs, kmod, name, eps):
    hk, hv, B, nslots = 2, 4, 4, 5
    qkv, a, b, A_log, dt_bias, state = inputs(1, B, hk, hv, nslots, pad=16)
    shrink_qk(qkv, hk, 0, (1e-4, 1.0, 1.0, 2e-4))    # batch row 0 (slot 3): q head 0, k head 1 tiny
    shrink_qk(qkv, hk, 2, (1.0, 5e-4, 1e-4, 1.0))    # batch row 2 (slot 0): q head 1, k head 0 tiny
    state0 = state.clone()
    slot_l = [3, -1, 0, 7]  # -1 and 7 (>= nslots): no state access, o = 0
    slots = torch.tensor(slot_l, dtype=torch.int32)
    o = torch.full((B, hv, VD), float("nan"), dtype=torch.bfloat16)
    step(kmod, specs[name], qkv, a, b, A_log, dt_bias, state, slots, o, hk, hv, eps)
    args = (np64(qkv), np64(a), np64(b), np64(A_log), np64(dt_bias), np64(state0), slot_l, hk, hv)
    o_ref, st_ref = R.gdn_decode(*args, eps=eps)
    o10, _ = R.gdn_decode(*args, eps=10 * eps)
    assert rel_err(o10, o_ref) > 0.05, "inputs do not make eps matter"
    on = np64(o)
    assert np.isfinite(on).all(), "unwritten output"
    assert rel_err(on, o_ref) < 1e-2
    rows_close(on, o_ref, 1e-2, "o")
    assert np.all(on[1] == 0) and np.all(on[3] == 0)
    sn = np64(state)
    for sl in (3, 0):
        err = np.max(np.abs(sn[sl] - st_ref[sl])) / np.max(np.abs(st_ref[sl]))
        assert err < 1e-5, f"slot {sl}: state error {err:.2e}"
    for sl in (1, 2, 4):
        assert torch.equal(state[sl], state0[sl]), f"slot {sl} must be untouched"


def test_decode_chain_grouped_heads(specs, kmod):
    """Three steps with Hv/Hk = 3 (value head h uses key head h // 3); the state carries between steps."""
    hk, hv, B, nslots = 1, 3, 2, 2
    spec = specs["recurrent.k128_v128.bv32"]
    _, _, _, A_log, dt_bias, state = inputs(2, B, hk, hv, nslots)
    st_ref = np64(state)
    slot_l = [1, 0]
    slots = torch.tensor(slot_l, dtype=torch.int32)
    for it in range(3):
        qkv, a, b, _, _, _ = inputs(10 + it, B, hk, hv, nslots)
        o = torch.full((B, hv, VD), float("nan"), dtype=torch.bfloat16)
        step(kmod, spec, qkv, a, b, A_log, dt_bias, state, slots, o, hk, hv)
        o_ref, st_ref = R.gdn_decode(np64(qkv), np64(a), np64(b), np64(A_log), np64(dt_bias), st_ref, slot_l, hk, hv)
        assert rel_err(np64(o), o_ref) < 1e-2, f"step {it}"
        assert np.max(np.abs(np64(state) - st_ref)) < 1e-5 * np.max(np.abs(st_ref)), f"step {it} state"


@pytest.mark.parametrize("name", ["recurrent.k128_v128.bv32.ba", "recurrent.k128_v128.bv16.ba"])
def test_decode_step_computes_b_and_a(specs, kmod, name):
    """BA: b = bf16(x . w_ba[h]), a = bf16(x . w_ba[Hv + h]) in the step. H = 1040 (a chunk of 1024 and a tail of
    16); x and w_ba rows padded with NaN past H (a read past H shows); the reference rounds the float64 dots to
    bf16 before the float64 step (a swapped b / a or a wrong row shows in the gate and decay)."""
    hk, hv, B, nslots, H = 2, 4, 3, 4, 1040
    qkv, _, _, A_log, dt_bias, state = inputs(5, B, hk, hv, nslots)
    g = torch.Generator().manual_seed(6)
    xf = torch.full((B, H + 16), float("nan")).to(torch.bfloat16)
    xf[:, :H] = (torch.randn(B, H, generator=g)).to(torch.bfloat16)
    wf = torch.full((2 * hv, H + 32), float("nan")).to(torch.bfloat16)
    wf[:, :H] = (torch.randn(2 * hv, H, generator=g) * 0.06).to(torch.bfloat16)
    x, w = xf[:, :H], wf[:, :H]
    dots = np64(x) @ np64(w).T
    bf = torch.from_numpy(dots).to(torch.bfloat16)
    b_ref, a_ref = bf[:, :hv], bf[:, hv:]
    assert (np64(a_ref) != np64(b_ref)).any() and np.abs(dots).max() > 1.0
    state0 = state.clone()
    slot_l = [2, 0, -1]
    o = torch.full((B, hv, VD), float("nan"), dtype=torch.bfloat16)
    step(kmod, specs[name], qkv, x, w, A_log, dt_bias, state, torch.tensor(slot_l, dtype=torch.int32), o, hk, hv,
         H=H)
    o_ref, st_ref = R.gdn_decode(np64(qkv), np64(a_ref), np64(b_ref), np64(A_log), np64(dt_bias), np64(state0),
                                 slot_l, hk, hv, eps=EPS)
    on = np64(o)
    assert np.isfinite(on).all()
    rows_close(on, o_ref, 1e-2, "o")
    assert np.all(on[2] == 0)
    for sl in (2, 0):
        err = np.max(np.abs(np64(state)[sl] - st_ref[sl])) / np.max(np.abs(st_ref[sl]))
        assert err < 1e-4, f"slot {sl}: state error {err:.2e}"
    for sl in (1, 3):
        assert torch.equal(state[sl], state0[sl])


# ------------------------------------------------------------------ op validation (no GPU: fake device pointers)

def _ref(shape, dtype, ptr=0x10000, strides=None):
    from vkc_runtime.memory import TensorRef
    if strides is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.insert(0, acc)
            acc *= s
    return TensorRef(ptr, tuple(shape), tuple(strides), dtype, 0)


def _decode_args(B=2, hk=2, hv=4, nslots=3, **over):
    d = dict(qkv=_ref((B, 2 * hk * 128 + hv * 128), "bfloat16"), a=_ref((B, hv), "bfloat16"),
             b=_ref((B, hv), "bfloat16"), A_log=_ref((hv,), "float32"), dt_bias=_ref((hv,), "float32"),
             state=_ref((nslots, hv, 128, 128), "float32"), slot_idx=_ref((B,), "int32"),
             out=_ref((B, hv, 128), "bfloat16"))
    d.update(over)
    return d


@pytest.mark.parametrize("over,needle", [
    (dict(qkv=_ref((2, 1000), "bfloat16")), "channels"),
    (dict(a=_ref((2, 4), "float32")), "a must be bfloat16"),
    (dict(state=_ref((3, 4, 128, 128), "bfloat16")), "state must be float32"),
    (dict(state=_ref((3, 4, 128, 128), "float32", ptr=0x10004)), "16-byte aligned"),
    (dict(state=_ref((3, 4, 128, 128), "float32", strides=(70008, 16384, 128, 1))), "multiple of 16"),
    (dict(state=_ref((3, 4, 128, 64), "float32")), "state has shape"),
    (dict(slot_idx=_ref((3,), "int32")), "slot_idx has shape"),
    (dict(slot_idx=_ref((2,), "int64")), "slot_idx must be int32"),
    (dict(out=_ref((2, 4, 128), "bfloat16", strides=(1024, 256, 1))), "heads must be contiguous"),
])
def test_recurrent_decode_validation(over, needle):
    from vkc_runtime.ops import gdn_decode
    kw = _decode_args(**over)
    with pytest.raises(gdn_decode.OpError if hasattr(gdn_decode, "OpError") else ValueError, match=needle):
        gdn_decode.recurrent_decode(kw["qkv"], kw["a"], kw["b"], kw["A_log"], kw["dt_bias"], kw["state"],
                                    kw["slot_idx"], 2, 4, out=kw["out"])


def test_recurrent_decode_ba_validation():
    from vkc_runtime.ops import gdn_decode
    from vkc_runtime.ops._check import OpError
    kw = _decode_args()
    rest = [kw[k] for k in ("A_log", "dt_bias", "state", "slot_idx")]
    x, w = _ref((2, 256), "bfloat16", ptr=0x900000), _ref((8, 256), "bfloat16", ptr=0xA00000)
    with pytest.raises(OpError, match="pass a=None, b=None"):
        gdn_decode.recurrent_decode(kw["qkv"], kw["a"], kw["b"], *rest, 2, 4, out=kw["out"], ba=(x, w))
    with pytest.raises(OpError, match="w_ba has shape"):
        gdn_decode.recurrent_decode(kw["qkv"], None, None, *rest, 2, 4, out=kw["out"],
                                    ba=(x, _ref((6, 256), "bfloat16", ptr=0xA00000)))
    with pytest.raises(OpError, match="ba.x has shape"):
        gdn_decode.recurrent_decode(kw["qkv"], None, None, *rest, 2, 4, out=kw["out"],
                                    ba=(_ref((3, 256), "bfloat16", ptr=0x900000), w))


def test_recurrent_decode_heads_validation():
    from vkc_runtime.ops import gdn_decode
    from vkc_runtime.ops._check import OpError
    kw = _decode_args()
    with pytest.raises(OpError, match="multiple of num_k_heads"):
        gdn_decode.recurrent_decode(*[kw[k] for k in ("qkv", "a", "b", "A_log", "dt_bias", "state", "slot_idx")], 3, 4,
                                    out=kw["out"])


@pytest.mark.parametrize("fn,kw,needle", [
    ("causal_conv1d", dict(x=_ref((8, 64), "bfloat16"), weight=_ref((64, 3), "bfloat16"),
                           cu_seqlens=_ref((2,), "int32")), "weight has shape"),
    ("causal_conv1d", dict(x=_ref((8, 64), "bfloat16"), weight=_ref((64, 4), "bfloat16"),
                           cu_seqlens=_ref((2,), "int32"), conv_state=_ref((4, 3, 64), "bfloat16")),
     "together"),
    ("causal_conv1d", dict(x=_ref((8, 64), "bfloat16"), weight=_ref((64, 4), "bfloat16"),
                           cu_seqlens=_ref((3,), "int32"), conv_state=_ref((4, 64, 3), "bfloat16"),
                           slot_idx=_ref((2,), "int32")), "conv_state has shape"),
    ("causal_conv1d", dict(x=_ref((8, 64), "bfloat16"), weight=_ref((64, 4), "bfloat16"),
                           cu_seqlens=_ref((3,), "int32"), out=_ref((8, 64), "bfloat16", ptr=0x10000 + 64)),
     "must not overlap"),
    ("causal_conv1d_update", dict(x=_ref((2, 64), "bfloat16"), weight=_ref((64, 4), "bfloat16"),
                                  conv_state=_ref((4, 3, 64), "bfloat16"), slot_idx=_ref((3,), "int32")),
     "slot_idx has shape"),
    ("causal_conv1d_update", dict(x=_ref((2, 64), "bfloat16"), weight=_ref((64, 4), "bfloat16"),
                                  conv_state=_ref((4, 3, 64), "float32"), slot_idx=_ref((2,), "int32")),
     "conv_state must be bfloat16"),
])
def test_conv_validation(fn, kw, needle):
    from vkc_runtime.ops import conv
    from vkc_runtime.ops._check import OpError
    kw = dict(kw)
    if "out" not in kw:
        kw["out"] = _ref(kw["x"].shape, "bfloat16", ptr=0x900000)
    args = [kw.pop(k) for k in (("x", "weight", "cu_seqlens") if fn == "causal_conv1d"
                                else ("x", "weight", "conv_state", "slot_idx"))]
    with pytest.raises(OpError, match=needle):
        getattr(conv, fn)(*args, **kw)
