"""GPU (H200) checks of the conv family (causal conv1d prefill/update) and the GDN packed decode step against
float64 references: fresh random data, poisoned outputs, negative slots mixed in, both Qwen3.6 head configs,
a large B*Hv grid, prefill + decode continuation == one conv over the whole sequence, FLA when importable,
graph replay == eager."""
from __future__ import annotations

import numpy as np
import pytest

from tests import refs_gdn_decode as R
from tests.gpu.paths import validated_then_bound
from tests.refs import rel_err

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

D = 128


@pytest.fixture(scope="module")
def ops():
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import conv, gdn_decode
    return conv, gdn_decode


def gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def rnd(g, *shape, scale=1.0, dtype=torch.bfloat16):
    return (torch.randn(*shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(dtype)


def np64(t):
    return t.double().cpu().numpy()


def decode_ref_torch(qkv, a, b, A_log, dt_bias, state, slots, hk, hv, eps=1e-6):
    """Vectorized float64 reference on the GPU (same math as refs_gdn_decode.gdn_decode)."""
    B = qkv.shape[0]
    x = qkv.double()
    q = x[:, :hk * D].view(B, hk, D)
    k = x[:, hk * D:2 * hk * D].view(B, hk, D)
    v = x[:, 2 * hk * D:].view(B, hv, D)
    q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + eps)
    k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + eps)
    G = hv // hk
    q, k = q.repeat_interleave(G, 1), k.repeat_interleave(G, 1)
    g = -torch.exp(A_log.double()) * torch.nn.functional.softplus(a.double() + dt_bias.double())
    beta = torch.sigmoid(b.double())
    ok = (slots >= 0) & (slots < state.shape[0])
    idx = torch.where(ok, slots, 0).long()
    S = state[idx].double() * torch.exp(g)[..., None, None]
    delta = beta[..., None] * (v - torch.einsum("bhkv,bhk->bhv", S, k))
    S = S + k[..., :, None] * delta[..., None, :]
    o = torch.einsum("bhkv,bhk->bhv", S, q * D ** -0.5)
    o[~ok] = 0
    new = state.double().clone()
    new[idx[ok]] = S[ok]
    return o, new


def make_decode(seed, B, hk, hv, nslots, neg_every=5):
    g = gen(seed)
    qkv = rnd(g, B, 2 * hk * D + hv * D, scale=2.0)
    a, b = rnd(g, B, hv, scale=2.0), rnd(g, B, hv, scale=2.0)
    A_log = torch.rand(hv, generator=g, device="cuda") * 2 - 1
    dt_bias = rnd(g, hv, scale=0.5, dtype=torch.float32)
    state = rnd(g, nslots, hv, D, D, scale=0.3, dtype=torch.float32)
    perm = torch.randperm(nslots, generator=g, device="cuda")[:B].to(torch.int32)
    if neg_every:
        perm[::neg_every] = -1
    return qkv, a, b, A_log, dt_bias, state, perm


@pytest.mark.parametrize("hk,hv", [(16, 48), (16, 32)])
@pytest.mark.parametrize("B", [1, 16, 64, 256])
def test_decode_vs_float64(ops, B, hk, hv):
    _, G = ops
    qkv, a, b, A_log, dt_bias, state, slots = make_decode(B * 7 + hv, B, hk, hv, B + 3, neg_every=5 if B > 1 else 0)
    state0 = state.clone()
    o = torch.full((B, hv, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    G.recurrent_decode(qkv, a, b, A_log, dt_bias, state, slots, hk, hv, out=o)
    torch.cuda.synchronize()
    o_ref, st_ref = decode_ref_torch(qkv, a, b, A_log, dt_bias, state0, slots, hk, hv)
    assert not torch.isnan(o).any(), "unwritten output"
    assert rel_err(np64(o), np64(o_ref)) < 1e-2
    neg = slots < 0
    assert torch.all(o[neg] == 0)
    err = ((state.double() - st_ref).abs().max() / st_ref.abs().max()).item()
    assert err < 1e-5, f"state error {err:.2e}"
    if B <= 16:  # the numpy reference agrees with the torch one
        o2, _ = R.gdn_decode(np64(qkv), np64(a), np64(b), np64(A_log), np64(dt_bias), np64(state0),
                             slots.cpu().numpy(), hk, hv)
        assert rel_err(np64(o_ref), o2) < 1e-12


@pytest.mark.parametrize("tile", ["bv32", "bv16"])
def test_decode_large_grid(ops, tile):
    """B * Hv = 98304 (x4 or x8 programs): far beyond the 65535 of grid axes y/z."""
    _, G = ops
    B, hk, hv = 2048, 16, 48
    qkv, a, b, A_log, dt_bias, state, slots = make_decode(11, B, hk, hv, B, neg_every=7)
    state0 = state.clone()
    o = torch.full((B, hv, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    G.recurrent_decode(qkv, a, b, A_log, dt_bias, state, slots, hk, hv, out=o, _tile=tile)
    torch.cuda.synchronize()
    for lo in range(0, B, 512):  # reference in chunks (float64 state copies are large)
        sl = slice(lo, lo + 512)
        o_ref, st_ref = decode_ref_torch(qkv[sl], a[sl], b[sl], A_log, dt_bias, state0, slots[sl], hk, hv)
        assert rel_err(np64(o[sl]), np64(o_ref)) < 1e-2
        s = slots[sl][slots[sl] >= 0].long()
        assert ((state[s].double() - st_ref[s]).abs().max() / st_ref[s].abs().max()).item() < 1e-5
        del st_ref
    untouched = torch.ones(B, dtype=torch.bool, device="cuda")
    untouched[slots[slots >= 0].long()] = False
    assert torch.equal(state[untouched], state0[untouched])


def test_decode_strided_inputs_and_graph(ops):
    """a/b as column slices of one projection, qkv with padded rows; CUDA-graph replay == eager."""
    import vkc_runtime
    _, G = ops
    B, hk, hv = 33, 16, 32
    g = gen(3)
    qkv_buf = rnd(g, B, 2 * hk * D + hv * D + 64, scale=2.0)
    qkv = qkv_buf[:, :2 * hk * D + hv * D]
    ab = rnd(g, B, 2 * hv + 16, scale=2.0)
    a, b = ab[:, :hv], ab[:, hv + 16:]
    _, _, _, A_log, dt_bias, state, slots = make_decode(4, B, hk, hv, 40)
    st_eager, st_graph = state.clone(), state.clone()
    o1 = torch.empty(B, hv, D, device="cuda", dtype=torch.bfloat16)
    o2 = torch.full_like(o1, float("nan"))
    G.recurrent_decode(qkv, a, b, A_log, dt_bias, st_eager, slots, hk, hv, out=o1)
    o_ref, st_ref = decode_ref_torch(qkv, a, b, A_log, dt_bias, state, slots, hk, hv)
    s = torch.cuda.Stream()
    graph = vkc_runtime.Graph()
    torch.cuda.synchronize()
    with graph.capture(s.cuda_stream):
        G.recurrent_decode(qkv, a, b, A_log, dt_bias, st_graph, slots, hk, hv, out=o2, stream=s.cuda_stream)
    graph.replay(s.cuda_stream)
    torch.cuda.synchronize()
    assert rel_err(np64(o1), np64(o_ref)) < 1e-2
    assert torch.equal(o1, o2) and torch.equal(st_eager, st_graph)


@pytest.mark.parametrize("hk,hv,H", [(16, 32, 2048), (16, 48, 5120)])
@pytest.mark.parametrize("B", [1, 7, 64])
def test_decode_computing_b_and_a(ops, B, hk, hv, H):
    """ba=(x, w_ba) (the .ba kernels): the step with b = bf16(x . w_ba[h]) and a = bf16(x . w_ba[Hv + h]) vs the
    float64 step on those bf16 values (35B-A3B's and 27B's hidden sizes); x rows and w_ba rows strided; vs the
    unfused step on b / a from torch's bf16 matmul of the same rows (equal up to the dots' fp32 summation order);
    graph replay == eager."""
    import vkc_runtime
    _, G = ops
    qkv, _, _, A_log, dt_bias, state, slots = make_decode(40 + B, B, hk, hv, B + 3, neg_every=3 if B > 1 else 0)
    g = gen(41 + B)
    x = rnd(g, B, H + 64)[:, :H]
    w = rnd(g, 2 * hv, H + 32, scale=0.05)[:, :H]
    dots = x.double() @ w.double().T
    bf = dots.to(torch.bfloat16)
    b_ref, a_ref = bf[:, :hv], bf[:, hv:]
    # a dot within fp32 summation noise of a bf16 rounding boundary may round the other way in the kernel (one bf16
    # ulp of b or a: ~1e-3 of the head's state); those (row, head) pairs are excepted from the strict check, counted
    noise = 1e-5 * (x.double().abs() @ w.double().abs().T)  # > the fp32 sums' error (~sqrt(H) 2^-24 sum |x w|)
    amb = ((dots + noise).to(torch.bfloat16) != bf) | ((dots - noise).to(torch.bfloat16) != bf)
    amb = amb[:, :hv] | amb[:, hv:]
    o_ref, st_ref = decode_ref_torch(qkv, a_ref, b_ref, A_log, dt_bias, state, slots, hk, hv)
    st, st_graph, st_plain = state.clone(), state.clone(), state.clone()
    o = torch.full((B, hv, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    G.recurrent_decode(qkv, None, None, A_log, dt_bias, st, slots, hk, hv, out=o, ba=(x, w))
    torch.cuda.synchronize()
    assert rel_err(np64(o), np64(o_ref)) < 1e-2
    ok = slots >= 0
    assert torch.all(o[~ok] == 0)
    idx = slots[ok].long()
    strict = ~amb[ok]
    err = ((st[idx].double() - st_ref[idx])[strict].abs().max() / st_ref[idx].abs().max()).item()
    print(f"B={B} H={H}: {int(amb[ok].sum())} of {int(ok.sum()) * hv} heads at a rounding boundary, state error "
          f"{err:.2e}")
    assert err < 1e-5, f"state error {err:.2e}"
    untouched = ~torch.isin(torch.arange(st.shape[0], device="cuda"), idx)
    assert torch.equal(st[untouched], state[untouched])
    mm = x @ w.T  # torch's bf16 GEMM: what the unfused engine path feeds the step
    o_plain = torch.empty_like(o)
    G.recurrent_decode(qkv, mm[:, hv:], mm[:, :hv], A_log, dt_bias, st_plain, slots, hk, hv, out=o_plain)
    assert rel_err(np64(o), np64(o_plain)) < 1e-2
    o2 = torch.full_like(o, float("nan"))
    s = torch.cuda.Stream()
    graph = vkc_runtime.Graph()
    torch.cuda.synchronize()
    with graph.capture(s.cuda_stream):
        G.recurrent_decode(qkv, None, None, A_log, dt_bias, st_graph, slots, hk, hv, out=o2, stream=s.cuda_stream,
                           ba=(x, w))
    graph.replay(s.cuda_stream)
    torch.cuda.synchronize()
    assert torch.equal(o, o2) and torch.equal(st, st_graph)


def test_decode_bound_calls_match_validated_calls(ops, monkeypatch):
    """Three decode steps, each on its own tensors (one layout), state updated in place: with bound calls the
    first step validates and the other two replay through _native.BoundCall; outputs and states byte-identical
    to validated calls (VKC_FASTPATH=0)."""
    _, G = ops
    B, hk, hv = 16, 16, 48
    res = {}
    for fast in validated_then_bound(monkeypatch):
        got = []
        for step in range(3):
            qkv, a, b, A_log, dt_bias, state, slots = make_decode(50 + step, B, hk, hv, 40)
            out = torch.full((B, hv, D), float("nan"), device="cuda", dtype=torch.bfloat16)
            G.recurrent_decode(qkv, a, b, A_log, dt_bias, state, slots, hk, hv, out=out)
            got.append((out, state))
        torch.cuda.synchronize()
        assert G._calls.hits == (2 if fast == "1" else 0)
        res[fast] = got
    for (o0, s0), (o1, s1) in zip(res["0"], res["1"]):
        assert torch.equal(o0, o1) and torch.equal(s0, s1)


@pytest.mark.peer
def test_decode_vs_fla(ops):
    fr = pytest.importorskip("fla.ops.gated_delta_rule")
    _, G = ops
    B, hk, hv = 64, 16, 48
    qkv, a, b, A_log, dt_bias, state, _ = make_decode(21, B, hk, hv, B, neg_every=0)
    slots = torch.arange(B, device="cuda", dtype=torch.int32)
    state0 = state.clone()
    o = torch.empty(B, hv, D, device="cuda", dtype=torch.bfloat16)
    G.recurrent_decode(qkv, a, b, A_log, dt_bias, state, slots, hk, hv, out=o)
    rep = hv // hk
    q = qkv[:, :hk * D].view(B, 1, hk, D).repeat_interleave(rep, 2)
    k = qkv[:, hk * D:2 * hk * D].view(B, 1, hk, D).repeat_interleave(rep, 2)
    v = qkv[:, 2 * hk * D:].contiguous().view(B, 1, hv, D)
    gg = (-torch.exp(A_log) * torch.nn.functional.softplus(a.float() + dt_bias)).view(B, 1, hv)
    beta = torch.sigmoid(b.float()).view(B, 1, hv)
    try:
        o_fla, st_fla = fr.fused_recurrent_gated_delta_rule(q, k, v, g=gg, beta=beta, scale=D ** -0.5,
                                                            initial_state=state0, output_final_state=True,
                                                            use_qk_l2norm_in_kernel=True)
    except TypeError as e:
        pytest.skip(f"FLA signature differs: {e}")
    torch.cuda.synchronize()
    assert rel_err(np64(o), np64(o_fla.view(B, hv, D))) < 2e-2
    assert ((state - st_fla.float()).abs().max() / st_fla.float().abs().max()).item() < 1e-4


# ----------------------------------------------------------------------------------------------- conv

@pytest.mark.parametrize("C", [10240, 8192, 1000])
def test_conv_prefill_varlen_with_states(ops, C):
    conv, _ = ops
    g = gen(C)
    lens = [1, 2, 3, 17, 0, 100, 33, 5, 1, 250]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    T = int(cu[-1])
    x, w = rnd(g, T, C, scale=2.0), rnd(g, C, 4, scale=0.5)
    nslots = 16
    state = rnd(g, nslots, 3, C, scale=2.0)
    state0 = state.clone()
    slot_l = [3, -1, 0, 7, 9, 2, 15, -1, 11, 4]
    slots = torch.tensor(slot_l, dtype=torch.int32, device="cuda")
    y = torch.full((T, C), float("nan"), device="cuda", dtype=torch.bfloat16)
    conv.causal_conv1d(x, w, cu, conv_state=state, slot_idx=slots, out=y)
    torch.cuda.synchronize()
    y_ref, st_ref = R.conv_prefill(np64(x), np64(w), cu.cpu().numpy(), np64(state0), slot_l)
    assert not torch.isnan(y).any()
    assert rel_err(np64(y), y_ref) < 1e-2
    assert np.array_equal(np64(state), st_ref)


@pytest.mark.parametrize("B,C", [(1, 10240), (64, 8192), (256, 10240), (7, 1000)])
def test_conv_update(ops, B, C):
    conv, _ = ops
    g = gen(B + C)
    x, w = rnd(g, B, C, scale=2.0), rnd(g, C, 4, scale=0.5)
    nslots = B + 4
    state = rnd(g, nslots, 3, C, scale=2.0)
    state0 = state.clone()
    slots = torch.randperm(nslots, device="cuda")[:B].to(torch.int32)
    slots[::3] = -1
    y = torch.full((B, C), float("nan"), device="cuda", dtype=torch.bfloat16)
    conv.causal_conv1d_update(x, w, state, slots, out=y)
    torch.cuda.synchronize()
    y_ref, st_ref = R.conv_update(np64(x), np64(w), np64(state0), slots.cpu().numpy())
    assert rel_err(np64(y), y_ref) < 1e-2
    assert torch.all(y[slots < 0] == 0)
    assert np.array_equal(np64(state), st_ref)


def test_conv_bound_calls_match_validated_calls(ops, monkeypatch):
    """causal_conv1d (varlen, with states) and causal_conv1d_update (separate out, and in place): three calls each on
    their own tensors; with bound calls the first validates and two replay (pointer relations re-checked).
    Outputs and conv states byte-identical to validated calls (VKC_FASTPATH=0)."""
    conv, _ = ops
    C, B = 8192, 16
    lens = [1, 17, 0, 100, 3]
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    T = int(cu[-1])
    slots = torch.tensor([3, -1, 0, 7, 9], dtype=torch.int32, device="cuda")
    uslots = torch.randperm(B + 4, device="cuda")[:B].to(torch.int32)
    res = {}
    for fast in validated_then_bound(monkeypatch):
        got = []
        for i in range(3):
            g = gen(700 + i)
            w = rnd(g, C, 4, scale=0.5)
            x, st = rnd(g, T, C, scale=2.0), rnd(g, 16, 3, C, scale=2.0)
            y = torch.full((T, C), float("nan"), device="cuda", dtype=torch.bfloat16)
            conv.causal_conv1d(x, w, cu, conv_state=st, slot_idx=slots, out=y)
            xu, stu = rnd(g, B, C, scale=2.0), rnd(g, B + 4, 3, C, scale=2.0)
            yu = torch.full((B, C), float("nan"), device="cuda", dtype=torch.bfloat16)
            conv.causal_conv1d_update(xu, w, stu, uslots, out=yu)
            xi, sti = rnd(g, B, C, scale=2.0), rnd(g, B + 4, 3, C, scale=2.0)
            conv.causal_conv1d_update(xi, w, sti, uslots, out=xi)  # in place
            got += [y, st, yu, stu, xi, sti]
        torch.cuda.synchronize()
        assert conv._calls.hits == (6 if fast == "1" else 0)
        res[fast] = got
    for a, b in zip(res["0"], res["1"]):
        assert not torch.isnan(a.float()).any() and torch.equal(a, b)


def test_prefill_then_decode_equals_full_conv_and_gdn(ops):
    """Conv prefill of a prompt then decode steps (conv update + GDN decode step) continue it exactly as
    a conv over the whole sequence and a token-by-token recurrence would."""
    conv, G = ops
    hk, hv = 16, 32
    C = 2 * hk * D + hv * D
    g = gen(99)
    pre, steps = [5, 1, 40], 4
    N = len(pre)
    xs = [rnd(g, p + steps, C, scale=1.0) for p in pre]
    w = rnd(g, C, 4, scale=0.5)
    slot_l = [2, 0, 5]
    slots = torch.tensor(slot_l, dtype=torch.int32, device="cuda")
    cstate = torch.zeros(6, 3, C, device="cuda", dtype=torch.bfloat16)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(pre)]), dtype=torch.int32, device="cuda")
    xp = torch.cat([xi[:p] for xi, p in zip(xs, pre)])
    yp = conv.causal_conv1d(xp, w, cu, conv_state=cstate, slot_idx=slots, out=torch.empty_like(xp))
    A_log = torch.rand(hv, generator=g, device="cuda") * 2 - 1
    dt_bias = rnd(g, hv, scale=0.5, dtype=torch.float32)
    gstate = torch.zeros(6, hv, D, D, device="cuda")
    outs = []
    ab = [(rnd(g, N, hv), rnd(g, N, hv)) for _ in range(steps)]
    for st in range(steps):
        xd = torch.stack([xs[i][pre[i] + st] for i in range(N)])
        yd = conv.causal_conv1d_update(xd, w, cstate, slots, out=torch.empty_like(xd))
        outs.append((yd, G.recurrent_decode(yd, ab[st][0], ab[st][1], A_log, dt_bias, gstate, slots, hk, hv,
                                            out=torch.empty(N, hv, D, device="cuda", dtype=torch.bfloat16))))
    torch.cuda.synchronize()
    full = torch.cat(xs)
    cu_f = np.concatenate([[0], np.cumsum([p + steps for p in pre])])
    y_ref, cst_ref = R.conv_prefill(np64(full), np64(w), cu_f, np.zeros((6, 3, C)), slot_l)
    for i in range(N):
        got = torch.cat([yp[int(cu[i]):int(cu[i + 1])]] + [outs[s][0][i:i + 1] for s in range(steps)])
        assert rel_err(np64(got), y_ref[cu_f[i]:cu_f[i + 1]]) < 1e-2
    assert np.array_equal(np64(cstate), cst_ref)
    # the GDN decode steps on the conv outputs (fed the kernel's own bf16 conv output) vs float64 recurrence
    st_ref = np.zeros((6, hv, D, D))
    for s in range(steps):
        o_ref, st_ref = R.gdn_decode(np64(outs[s][0]), np64(ab[s][0]), np64(ab[s][1]), np64(A_log), np64(dt_bias),
                                     st_ref, slot_l, hk, hv)
        assert rel_err(np64(outs[s][1]), o_ref) < 1e-2
    assert np.max(np.abs(np64(gstate) - st_ref)) < 1e-4 * max(np.max(np.abs(st_ref)), 1e-6)
