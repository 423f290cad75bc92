"""Bound calls of the attention ops (vkc_runtime.bound.bind_call), driver-free: a call whose torch-like inputs
have the layout of a recent call skips validation and replays the recorded launches with the new pointers.
Checked here: replays launch exactly what validation launches (against VKC_FASTPATH=0 on the same inputs),
validation really is skipped, and every change of a guarded fact -- type, dtype, shape, strides, alignment,
device, is_cuda, scalar, options -- goes back through validation (same errors as without bound calls)."""
from __future__ import annotations

import pytest

from tests.ops_fakes import TorchLike as T, install_recorder, patch_ops
from vkc_runtime import bound, kernels
from vkc_runtime.ops import attn as A
from vkc_runtime.ops.attn import common as attn_common
from vkc_runtime.ops._check import OpError

I32 = "torch.int32"
B, Hq, Hkv, D, BS = 3, 24, 4, 256, 16
SCALE = D ** -0.5


@pytest.fixture()
def rec(monkeypatch):
    r = install_recorder(monkeypatch, A)
    monkeypatch.delenv("VKC_FASTPATH", raising=False)
    kernels.clear_cache()
    validated = []
    real = attn_common.cache_pair

    def counting(*a, **k):
        validated.append(a[0])
        return real(*a, **k)

    patch_ops(monkeypatch, A, "cache_pair", counting)
    r.validated = validated
    yield r
    kernels.clear_cache()


def caches(nb=B * 32, bs=BS):
    return T((nb, bs, Hkv, D)), T((nb, bs, Hkv, D))


def gate_view(n):  # the gate half of a [n, Hq, 2, D] projection: row stride Hq * 2 * D, head stride 2 * D
    return T((n, Hq, D), strides=(Hq * 2 * D, 2 * D, 1), offset_bytes=2 * D)


def _decode_layer(gate):
    return dict(q=T((B, Hq, D)), cache=caches(), out=T((B, Hq, D)), gate=gate_view(B) if gate else None)


def _prefill_layer(gate, n=70, bs=64):
    return dict(q=T((n, Hq, D)), cache=caches(40, bs), out=T((n, Hq, D)), gate=gate_view(n) if gate else None)


def _run_all(monkeypatch, rec, fastpath: bool, calls):
    monkeypatch.setenv("VKC_FASTPATH", "1" if fastpath else "0")
    kernels.clear_cache()
    rec.calls.clear()
    rec.validated.clear()
    for c in calls:
        c()
    return list(rec.calls), len(rec.validated)


@pytest.mark.parametrize("which,gate", [(w, g) for w in ("decode", "DecodePlan", "prefill", "PrefillPlan")
                                        for g in (False, True)] + [("reshape_and_cache", False)])
def test_bound_calls_launch_what_validation_launches(rec, monkeypatch, which, gate):
    """Five layers with fresh tensors (same layout, new pointers): with bound calls the first call validates and
    the other four replay; the launches equal those of five validated calls."""
    bt, sl, ws = T((B, 32), I32), T((B,), I32), workspace()
    cu, psl, pbt = T((3,), I32), T((2,), I32), T((2, 20), I32)
    if which in ("decode", "DecodePlan"):
        layers = [_decode_layer(gate) for _ in range(5)]
        plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=BS, workspace=ws,
                            max_seq_len=512)

        def call(L):
            if which == "decode":
                return lambda: A.decode(L["q"], *L["cache"], bt, sl, SCALE, gate=L["gate"], out=L["out"],
                                        workspace=ws, max_seq_len=512)
            return lambda: plan.run(L["q"], *L["cache"], SCALE, gate=L["gate"], out=L["out"])
    elif which in ("prefill", "PrefillPlan"):
        layers = [_prefill_layer(gate) for _ in range(5)]
        plan = A.PrefillPlan(cu, psl, pbt, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=64,
                             max_seqlen_q=70)

        def call(L):
            if which == "prefill":
                return lambda: A.prefill(L["q"], *L["cache"], pbt, cu, psl, SCALE, gate=L["gate"], out=L["out"],
                                         max_seqlen_q=70)
            return lambda: plan.run(L["q"], *L["cache"], SCALE, gate=L["gate"], out=L["out"])
    else:
        layers = [dict(k=T((50, Hkv, D)), v=T((50, Hkv, D)), cache=caches(), slots=T((50,), I32)) for _ in range(5)]

        def call(L):
            return lambda: A.reshape_and_cache(L["k"], L["v"], *L["cache"], L["slots"])
    calls = [call(L) for L in layers]
    want, n_checked = _run_all(monkeypatch, rec, False, calls)
    got, n_bound = _run_all(monkeypatch, rec, True, calls)
    assert got == want and len(want) >= 5
    assert n_checked == 5 and n_bound == 1  # validation ran once; four calls were replays
    # the replays used each layer's own pointers
    ptrs = {L["out"].data_ptr() if "out" in L else L["k"].data_ptr() for L in layers}
    assert ptrs <= {a for _, _, args in got for a in args}


def workspace():
    return A.DecodeWorkspace(T((B * Hq * 64 * D,), "torch.float32"), T((B * Hq * 64,), "torch.float32"),
                             T((B * Hq,), I32), B, Hq, D, 64)


@pytest.fixture()
def decode_once():
    """decode() of one batch layout on fresh tensors (a layer), with any of q / kc / vc / out replaced."""
    bt, sl, ws = T((B, 32), I32), T((B,), I32), workspace()

    def run(q=None, kc=None, vc=None, out=None, scale=SCALE, **kw):
        L = _decode_layer(False)
        A.decode(q or L["q"], kc or L["cache"][0], vc or L["cache"][1], bt, sl, scale, out=out or L["out"],
                 workspace=ws, max_seq_len=512, **kw)
    return run


@pytest.mark.parametrize("change,err", [
    (dict(q=T((B, Hq, D), offset_bytes=8)), r"q_ptr=0x[0-9a-f]+ must be 16-byte aligned"),
    (dict(q=T((B, Hq, D), dtype="torch.float16")), "q must be bfloat16"),
    (dict(q=T((B, Hq, D), is_cuda=False)), "not a CUDA device"),
    (dict(out=T((B, Hq, D), device=1)), "all tensors must be on one device"),
    (dict(out=T((B + 1, Hq, D))), "out has shape"),
    (dict(kc=T((B * 32, BS, Hkv, D), strides=(BS * Hkv * D, Hkv * D, 1, D))), "contiguous"),
    (dict(vc=T((B * 32, 64, Hkv, D))), "v_cache has shape"),
    (dict(q=T((B, Hq, D), strides=(Hq * D + 8, D, 1))), "stride_qb=0x1808 must be a multiple of 16"),
])
def test_bound_call_refuses_what_validation_refuses(rec, decode_once, change, err):
    """After a recorded call, an input that differs in any guarded fact is validated again: the same error as
    without bound calls, and nothing is launched."""
    decode_once()
    decode_once()
    assert len(rec.validated) == 1 and len(rec.calls) == 4  # the second call was a replay (split + combine)
    rec.calls.clear()
    with pytest.raises(OpError, match=err):
        decode_once(**change)
    assert not rec.calls and len(rec.validated) == 2


def test_bound_call_keys_options_and_scalars(rec, decode_once):
    """A different scale, split count or a new layout records a new bound call (its launches carry the new
    values); an aligned pointer with less alignment than recorded (16 -> 32 bytes is more, fine) replays."""
    decode_once()
    decode_once(scale=0.5)
    assert len(rec.validated) == 2 and rec.calls[-2][2][7] == 0.5  # decode_split's scale argument
    decode_once(scale=0.5)
    decode_once()  # the first layout is still cached (a few per key)
    assert len(rec.validated) == 2
    decode_once(num_splits=2)
    assert len(rec.validated) == 3 and rec.calls[-1][1] == (B * Hkv * 2, 1, 1)  # 2 splits: one fused launch
    decode_once(q=T((B, Hq, D), offset_bytes=32))  # 32-byte aligned: at least the recorded 16
    assert len(rec.validated) == 3
    decode_once(q=T((B, Hq, D), strides=(Hq * D + 16, D, 1)))  # new but valid strides: validated, new call
    assert len(rec.validated) == 4 and rec.calls[-2][2][11] == Hq * D + 16


def test_fastpath_off_and_non_torch_inputs_always_validate(rec, monkeypatch):
    from tests.ops_fakes import Dev
    bt, sl, ws = T((B, 32), I32), T((B,), I32), workspace()
    for _ in range(3):  # CUDA-array-interface inputs (e.g. cupy) are never bound
        A.decode(Dev((B, Hq, D)), Dev((B * 32, BS, Hkv, D)), Dev((B * 32, BS, Hkv, D)), bt, sl, SCALE,
                 out=Dev((B, Hq, D)), workspace=ws, max_seq_len=512)
    assert len(rec.validated) == 3
    monkeypatch.setenv("VKC_FASTPATH", "0")
    q, (kc, vc), out = T((B, Hq, D)), caches(), T((B, Hq, D))
    for _ in range(3):
        A.decode(q, kc, vc, bt, sl, SCALE, out=out, workspace=ws, max_seq_len=512)
    assert len(rec.validated) == 6


# ------------------------------------------------------ row ops (norm, rope, act, embedding) and GDN decode
def _row_call(which):
    """A call of one row op (norm, rope, act, embedding) on fresh tensors (created now, so both runs below see the
    same pointers)."""
    from vkc_runtime.ops import act as AC, embedding as EM, norm as N, rope as RO
    M, H = 5, 48
    return {
        "rmsnorm": lambda x=T((M, 5120)), w=T((5120,)), o=T((M, 5120)): N.rmsnorm(x, w, 1e-6, out=o),
        "add_rmsnorm": lambda x=T((M, 5120)), r=T((M, 5120)), w=T((5120,)), o=T((M, 5120)):
            N.add_rmsnorm(x, r, w, 1e-6, out=o),
        "gated_rmsnorm": lambda x=T((M, H * 128)), z=T((M, H * 128)), w=T((128,)), o=T((M, H * 128)):
            N.gated_rmsnorm(x, z, w, out=o),
        "qk_norm_rope": lambda qg=T((M, 24 * 512)), k=T((M, 4 * 256)), p=T((M,), I32), wq=T((256,)), wk=T((256,)),
            qo=T((M, 24, 256)), ko=T((M, 4, 256)): RO.qk_norm_rope(qg, k, p, wq, wk, 24, 4, 256, q_out=qo, k_out=ko),
        "silu_mul": lambda x=T((M, 2 * 17408)), o=T((M, 17408)): AC.silu_mul(x, out=o),
        "sigmoid_mul": lambda x=T((M, 24 * 256)), g=gate_view(M), o=T((M, 24 * 256)): AC.sigmoid_mul(x, g, out=o),
        "embedding": lambda i=T((M,), I32), t=T((1000, 2048)), o=T((M, 2048)): EM.embedding(i, t, out=o),
    }[which]


def _gdn_decode_call(G):
    B, Hk, Hv = 3, 16, 48
    f32 = "torch.float32"
    args = (T((B, 2 * Hk * 128 + Hv * 128)), T((B, Hv)), T((B, Hv)), T((Hv,), f32), T((Hv,), f32),
            T((8, Hv, 128, 128), f32), T((B,), I32), Hk, Hv)
    out = T((B, Hv, 128))
    return lambda: G.recurrent_decode(*args, out=out)


def _conv_call(Cv, which):
    n, C, B = 40, 8192, 4
    if which == "causal_conv1d":
        args = (T((n, C)), T((C, 4)), T((3,), I32))
        st = dict(conv_state=T((10, 3, C)), slot_idx=T((2,), I32))
        out = T((n, C))
        return lambda: Cv.causal_conv1d(*args, **st, out=out)
    x = T((B, C))
    args = (T((C, 4)), T((10, 3, C)), T((B,), I32))
    out = x if which == "causal_conv1d_update_inplace" else T((B, C))
    return lambda: Cv.causal_conv1d_update(x, *args, out=out)


OTHER_OPS = ["rmsnorm", "add_rmsnorm", "gated_rmsnorm", "qk_norm_rope", "silu_mul", "sigmoid_mul", "embedding",
             "recurrent_decode", "causal_conv1d", "causal_conv1d_update", "causal_conv1d_update_inplace"]


@pytest.mark.parametrize("which", OTHER_OPS)
def test_other_ops_bind_too(monkeypatch, which):
    """The row ops (norm, rope, act, embedding), the GDN decode step and the conv ops: three calls, each on its own
    tensors of one layout, look up a kernel (validate) once with bound calls and three times without, and launch
    the same (pointers included)."""
    from tests.ops_fakes import Recorder, declared_bases
    from vkc_runtime.ops import act, conv as Cv, embedding, gdn_decode as G, norm, rope
    mod = (G if which == "recurrent_decode" else Cv if which.startswith("causal") else
           {"qk_norm_rope": rope, "silu_mul": act, "sigmoid_mul": act, "embedding": embedding}.get(which, norm))
    calls = [_gdn_decode_call(G) if mod is G else _conv_call(Cv, which) if mod is Cv else _row_call(which)
             for _ in range(3)]
    res = {}
    for fast in ("0", "1"):
        monkeypatch.setenv("VKC_FASTPATH", fast)
        bound.clear_bound_calls()
        r = Recorder(declared=declared_bases(mod))
        lookups = []
        monkeypatch.setattr(mod, "get_kernel", lambda base, device=None: lookups.append(base) or r(base))
        for c in calls:
            c()
        res[fast] = (r.calls, len(lookups))
    per = 2 if which == "causal_conv1d" else 1  # the conv prefill: body + heads launches
    assert len(res["0"][0]) == 3 * per and res["0"][1] == 3 * per and res["1"][1] == per
    assert res["1"][0] == res["0"][0]
    assert len({args for _, _, args in res["1"][0]}) == 3 * per  # each call launched with its own pointers


def test_unhashable_option_values_are_not_bound(rec, decode_once):
    """An option value that cannot key a bound call (a list) is never bound: each call validates -- here decode
    reads it as int(...) and refuses it with a clear error, before any launch."""
    with pytest.raises(TypeError):
        decode_once(num_splits=[2])
    assert not rec.calls


def test_conv_relations_are_guarded(rec, monkeypatch):
    """causal_conv1d_update binds "out is x" (in place) and "out does not overlap x" as relations: after a bound
    in-place call, an out that overlaps x without being x is refused by validation, and a separate out validates
    and binds anew."""
    from tests.ops_fakes import Recorder, declared_bases
    from vkc_runtime.ops import conv as Cv
    r = Recorder(declared=declared_bases(Cv))
    lookups = []
    monkeypatch.setattr(Cv, "get_kernel", lambda base, device=None: lookups.append(base) or r(base))
    B, C = 4, 8192
    w, st, sl = T((C, 4)), T((10, 3, C)), T((B,), I32)
    for _ in range(2):
        x = T((B, C))
        Cv.causal_conv1d_update(x, w, st, sl, out=x)
    assert len(lookups) == 1
    big = T((B + 1, C))  # two row-views of one buffer, one row apart: same layout, overlapping spans
    x, y = T((B, C)), T((B, C))
    x._ptr, y._ptr = big.data_ptr(), big.data_ptr() + 2 * C
    with pytest.raises(OpError, match="must not overlap"):
        Cv.causal_conv1d_update(x, w, st, sl, out=y)
    Cv.causal_conv1d_update(T((B, C)), w, st, sl, out=T((B, C)))
    Cv.causal_conv1d_update(T((B, C)), w, st, sl, out=T((B, C)))
    assert len(lookups) == 2  # the overlapping call was refused before any lookup, the first disjoint one
    # validated and bound, the second replayed
