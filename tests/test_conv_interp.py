"""CPU tests of kernels_src/conv (causal conv1d + SiLU, prefill varlen and decode update) through Triton's
interpreter (tests/conftest.py sets TRITON_INTERPRET=1), against float64 references in refs_gdn_decode.py.

Conv state layout [slots, W-1, C], channels contiguous. Checks: outputs (poisoned beforehand), in-place
final states bit-exact (they are copies of bf16 inputs), untouched slots/rows, negative and out-of-range
slots, sequences shorter than W-1, sequences whose first W-1 tokens straddle a program's token block,
empty sequences, rows past cu_seqlens[N], strided rows, C % 16 != 0, prefill + updates == one prefill.
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
from tests import refs_gdn_decode as R  # noqa: E402
from tests.refs import rel_err  # noqa: E402




INTERP = interpreter_active()
DEV = device()




@pytest.fixture(scope="module")
def K():
    mod = importlib.import_module("kernels_src.conv.conv")
    return SimpleNamespace(mod=mod, specs=specs("conv"))


def launch(K, name, grid, *args, **override):
    launch_spec(K.specs[name], grid, *args, **override)


def rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(DEV)




def check(out, ref, tol=1e-2, what="y"):
    o = np64(out)
    assert np.isfinite(o).all(), f"{what}: {np.count_nonzero(~np.isfinite(o))} non-finite (unwritten?)"
    err = rel_err(o, ref)
    assert err < tol, f"{what}: rel err {err:.3e}"
    assert np.max(np.abs(o - ref)) <= 2e-2 * max(np.max(np.abs(ref)), 1e-6), f"{what}: max abs error"


def prefill(K, variant, x, w, y, cu, state, slots, T, C, sub=None):
    """sub: tiles per program (default: the spec's SUB); small values spread a batch over several programs."""
    s = dict(K.specs[f"prefill.w4.{variant}"].constexprs)
    if sub is not None:
        s["SUB"] = sub
    N = cu.numel() - 1
    if state is None:
        st, sl, ss, sr, ns = y, cu, 0, 0, 0
    else:
        st, sl, ss, sr, ns = state, slots, state.stride(0), state.stride(1), state.shape[0]
    grid = (triton.cdiv(T, s["BLOCK_T"] * s["SUB"]), triton.cdiv(C, s["BLOCK_C"]))
    launch(K, f"prefill.w4.{variant}", grid, x, w, y, cu, x.stride(0), w.stride(0), y.stride(0), T, C, N,
           SUB=s["SUB"])
    if N:
        grid = (N, triton.cdiv(C, K.specs[f"heads.w4.{variant}"].constexprs["BLOCK_C"]))
        launch(K, f"heads.w4.{variant}", grid, x, w, y, st, cu, sl, x.stride(0), w.stride(0), y.stride(0), ss, sr,
               T, C, N, ns)


LENS = [15, 4, 0, 10, 2, 3, 7, 1]  # cu: 0 15 19 19 29 31 34 41 42


@pytest.mark.parametrize("sub", [1, 3, None])  # 4-, 12-row programs (several of them), the spec's
@pytest.mark.parametrize("variant,C,pad,extra", [("a16", 48, 16, 3), ("any", 40, 8, 0), ("a16", 160, 0, 0)])
def test_prefill_varlen_with_states(K, variant, C, pad, extra, sub):
    g = torch.Generator().manual_seed(C + pad)
    cu_l = np.concatenate([[0], np.cumsum(LENS)]).astype(np.int32)
    T = int(cu_l[-1]) + extra
    xb = rnd(g, T, C + pad, scale=2.0)
    x = xb[:, :C]
    w = rnd(g, C, 4, scale=0.5)
    nslots = 10
    state = rnd(g, nslots, 3, C, scale=2.0)
    state0 = state.clone()
    slot_l = [3, 0, 5, -1, 7, 2, 12, 9]  # 12: out of range -> treated as no state; seq 2 is empty
    yb = torch.full((T, C + pad), float("nan"), dtype=torch.bfloat16, device=DEV)
    y = yb[:, :C]
    cu = torch.tensor(cu_l, dtype=torch.int32, device=DEV)
    slots = torch.tensor(slot_l, dtype=torch.int32, device=DEV)
    prefill(K, variant, x, w, y, cu, state, slots, T, C, sub)
    y_ref, st_ref = R.conv_prefill(np64(x), np64(w), cu_l, np64(state0), slot_l)
    check(y, y_ref)
    assert np.array_equal(np64(state), st_ref), "final conv states differ (must be exact copies)"
    for sl in (1, 4, 6, 8, 5):  # unused slots and the empty sequence's slot are untouched
        assert torch.equal(state[sl].view(torch.int16), state0[sl].view(torch.int16))
    if pad:
        assert torch.isnan(yb[:, C:].float()).all(), "wrote past the row"


@pytest.mark.parametrize("variant", ["a16", "any"])
def test_prefill_no_state(K, variant):
    g = torch.Generator().manual_seed(7)
    C, lens = 32, [1, 20, 2]
    cu_l = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    T = int(cu_l[-1])
    x, w = rnd(g, T, C), rnd(g, C, 4, scale=0.5)
    y = torch.full((T, C), float("nan"), dtype=torch.bfloat16, device=DEV)
    cu = torch.tensor(cu_l, dtype=torch.int32, device=DEV)
    prefill(K, variant, x, w, y, cu, None, None, T, C)
    check(y, R.conv_prefill(np64(x), np64(w), cu_l)[0])


@pytest.mark.parametrize("variant,C", [("a16", 48), ("any", 40), ("a16", 1040)])
def test_update(K, variant, C):
    g = torch.Generator().manual_seed(100 + C)
    B, nslots = 5, 6
    x, w = rnd(g, B, C, scale=2.0), rnd(g, C, 4, scale=0.5)
    state = rnd(g, nslots, 3, C, scale=2.0)
    state0 = state.clone()
    slot_l = [4, -1, 0, 6, 2]  # -1 and 6 (out of range): y = 0, no state access
    slots = torch.tensor(slot_l, dtype=torch.int32, device=DEV)
    y = torch.full((B, C), float("nan"), dtype=torch.bfloat16, device=DEV)
    s = K.specs[f"update.w4.{variant}"]
    launch(K, f"update.w4.{variant}", (B, triton.cdiv(C, s.constexprs["BLOCK_C"])), x, w, y, state, slots,
           x.stride(0), w.stride(0), y.stride(0), state.stride(0), state.stride(1), C, nslots)
    y_ref, st_ref = R.conv_update(np64(x), np64(w), np64(state0), slot_l)
    check(y, y_ref)
    assert torch.equal(y[1].float(), torch.zeros(C)) and torch.equal(y[3].float(), torch.zeros(C))
    assert np.array_equal(np64(state), st_ref), "rolled conv state differs"
    for sl in (1, 3, 5):
        assert torch.equal(state[sl].view(torch.int16), state0[sl].view(torch.int16))


def test_prefill_then_updates_equals_full_prefill(K):
    """A prefill of the first part of each sequence, then decode updates for the remaining tokens, gives the
    same outputs as one prefill over the whole sequences (and the same final states)."""
    g = torch.Generator().manual_seed(5)
    C, nslots = 32, 4
    full_lens, pre_lens = [9, 4, 5], [6, 1, 2]
    steps = 3
    xs = [rnd(g, L, C, scale=2.0) for L in full_lens]
    w = rnd(g, C, 4, scale=0.5)
    slot_l = [2, 0, 3]
    state = torch.zeros(nslots, 3, C, dtype=torch.bfloat16, device=DEV)
    # part 1: prefill
    xp = torch.cat([xi[:p] for xi, p in zip(xs, pre_lens)])
    cu_l = np.concatenate([[0], np.cumsum(pre_lens)]).astype(np.int32)
    yp = torch.empty_like(xp)
    prefill(K, "a16", xp, w, yp, torch.tensor(cu_l, dtype=torch.int32), state,
            torch.tensor(slot_l, dtype=torch.int32), xp.shape[0], C)
    outs = [[yp[cu_l[i]:cu_l[i + 1]]] for i in range(3)]
    # part 2: decode steps
    slots = torch.tensor(slot_l, dtype=torch.int32)
    for st in range(steps):
        xd = torch.stack([xs[i][pre_lens[i] + st] for i in range(3)])
        yd = torch.empty_like(xd)
        launch(K, "update.w4.a16", (3, 1), xd, w, yd, state, slots, C, 4, C, state.stride(0), state.stride(1), C,
               nslots)
        for i in range(3):
            outs[i].append(yd[i:i + 1])
    tot = [p + steps for p in pre_lens]
    xf = torch.cat([xi[:L] for xi, L in zip(xs, tot)])
    cu_f = np.concatenate([[0], np.cumsum(tot)]).astype(np.int32)
    y_ref, st_ref = R.conv_prefill(np64(xf), np64(w), cu_f, np.zeros((nslots, 3, C)), slot_l)
    check(torch.cat([torch.cat(o) for o in outs]), y_ref)
    assert np.array_equal(np64(state), st_ref)
