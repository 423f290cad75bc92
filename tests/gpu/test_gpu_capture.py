"""GPU (H200, sm_90a): graph capture on any stream, torch's own capture stream included.

Every buffer a launch needs, Triton's hidden global scratch too, comes from a workspace the caller allocated
before capture, or from the context's default scratch, which does not depend on the stream
(vkc_runtime.scratch). The ops whose kernels use global scratch on sm_90a -- GDN prefill (delta_h's TMA
descriptors) and the TMA attention prefill -- are captured with ``torch.cuda.graph`` (torch's capture stream)
and with ``vkc_runtime.Graph`` on a new stream, with a workspace and no warm-up at all, and after an eager
warm-up on another stream; each graph is replayed into poisoned outputs, workspace and scratch and must give
the bytes an eager call gives."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

import vkc_runtime as vr  # noqa: E402
from vkc_runtime import kernels  # noqa: E402

APIS = ("torch", "vkc")


def _capture(api, fn):
    """Capture ``fn(stream handle)``; returns replay() (replays and waits) and what must stay alive."""
    torch.cuda.synchronize()
    if api == "torch":
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):  # torch's own capture stream, global capture mode
            fn(torch.cuda.current_stream().cuda_stream)

        def replay():
            g.replay()
            torch.cuda.synchronize()
        return replay, g
    s = vr.Stream()
    g = vr.Graph()
    with g.capture(s):
        fn(s.handle)

    def replay():
        g.replay(s)
        s.synchronize()
    return replay, (g, s)


def _on_side_stream(fn):
    """Run ``fn(stream handle)`` eagerly on a fresh torch stream (the warm-up is on a stream the graph is not)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(side.cuda_stream)
    side.synchronize()


def _same_bytes(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))

def _replays_equal_eager(api, call, shape, poison=None):
    """Capture ``call(out, stream)`` into a NaN-filled bf16 output, replay it twice (output re-poisoned, and
    ``poison()`` run, before each), run it eagerly into a fresh NaN buffer and assert every replay equals the
    finite eager result bytewise. Returns the eager output."""
    graph_out = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    replay, _keep = _capture(api, lambda s: call(graph_out, s))  # _keep: the graph lives until we return
    replays = []
    for _ in range(2):
        graph_out.fill_(float("nan"))
        if poison is not None:
            poison()
        torch.cuda.synchronize()
        replay()
        replays.append(graph_out.clone())
    eager = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    call(eager, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert torch.isfinite(eager.float()).all()
    for r in replays:
        assert _same_bytes(r, eager), "graph replay != eager"
    return eager



# ------------------------------------------------------------------------------------------------- GDN prefill
def _gdn_inputs(lens, hk, hv, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    T = int(sum(lens))
    qkv = torch.nn.functional.silu(torch.randn(T, 2 * hk * 128 + hv * 128, generator=g, device="cuda"))
    a = (torch.randn(T, hv, generator=g, device="cuda") * 2).to(torch.bfloat16)
    b = (torch.randn(T, hv, generator=g, device="cuda") * 2).to(torch.bfloat16)
    A_log = torch.rand(hv, generator=g, device="cuda") * 2 - 1
    dt_bias = torch.randn(hv, generator=g, device="cuda") * 0.5
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lens)]), dtype=torch.int32, device="cuda")
    return qkv.to(torch.bfloat16), a, b, A_log, dt_bias, cu


def _poison_gdn(ws):
    for arr in (ws.seqinfo, ws.cidx, ws.qn, ws.kn, ws.g, ws.beta, ws.w, ws.u, ws.h):
        arr.fill_bytes(0xFF)  # NaN for bf16 / fp32, -1 for int32
    if ws.scratch is not None:
        ws.scratch.buffer.fill_bytes(0xFF)  # the TMA descriptors must be built by the launch that reads them


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("warmup", [False, True], ids=["no-warmup", "warmup-other-stream"])
def test_gdn_prefill_capture_on_any_stream(api, warmup):
    from vkc_runtime.ops import gdn as G
    kernels.clear_cache()  # fresh default scratch: delta_h's scratch can only come from the workspace
    hk, hv = 16, 32
    lens = [100, 1, 300, 64]
    qkv, a, b, A_log, dt, cu = _gdn_inputs(lens, hk, hv, seed=5)
    T, N = qkv.shape[0], len(lens)
    ws = G.workspace_for(T + 64, N + 2, hk, hv)
    assert (ws.scratch is not None) == (kernels.get_kernel("gdn.delta_h").scratch_size > 0)
    if torch.cuda.get_device_capability() == (9, 0):
        assert ws.scratch is not None  # sm_90a's delta_h uses TMA descriptors in global scratch
    state0 = torch.randn(N + 2, hv, 128, 128, device="cuda") * 0.05
    slot = torch.tensor([3, -1, 0, 5], dtype=torch.int32, device="cuda")
    state = state0.clone()
    out = torch.full((T, hv, 128), float("nan"), device="cuda", dtype=torch.bfloat16)

    def call(stream):
        G.chunk_gated_delta_rule(qkv, a, b, A_log, dt, cu, hk, hv, state=state, slot_idx=slot, out=out,
                                 workspace=ws, stream=stream)

    if warmup:
        _on_side_stream(call)
    replay, keep = _capture(api, call)
    replays = []
    for _ in range(2):
        state.copy_(state0)
        out.fill_(float("nan"))
        _poison_gdn(ws)
        torch.cuda.synchronize()
        replay()
        replays.append((out.clone(), state.clone()))
    state.copy_(state0)
    out.fill_(float("nan"))
    _poison_gdn(ws)
    torch.cuda.synchronize()
    call(torch.cuda.current_stream().cuda_stream)  # eager, on torch's default stream
    torch.cuda.synchronize()
    assert torch.isfinite(out.float()).all() and out.float().abs().sum() > 0
    for o, st in replays:
        assert _same_bytes(o, out), "graph replay != eager (o)"
        assert _same_bytes(st, state), "graph replay != eager (final state)"
    untouched = [i for i in range(N + 2) if i not in (3, 0, 5)]
    assert _same_bytes(state[untouched], state0[untouched])


# ---------------------------------------------------------------------------------------------- TMA prefill
def _prefill_case(seed=0):
    Hq, Hkv, D, bs = 24, 4, 256, 64
    q_lens, prefix = [300, 17, 1000], [0, 4000, 64]
    lens = [q + p for q, p in zip(q_lens, prefix)]
    g = torch.Generator(device="cuda").manual_seed(seed)
    nblk = [-(-L // bs) for L in lens]
    nb = sum(nblk) + 3
    perm = torch.randperm(nb, generator=g, device="cuda").to(torch.int32)
    bt = torch.zeros(len(lens), max(nblk) + 1, dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(nblk):
        bt[i, :n] = perm[used:used + n]
        used += n
    kc = (torch.randn(nb, bs, Hkv, D, generator=g, device="cuda")).to(torch.bfloat16)
    vc = (torch.randn(nb, bs, Hkv, D, generator=g, device="cuda")).to(torch.bfloat16)
    T = sum(q_lens)
    q = torch.randn(T, Hq, D, generator=g, device="cuda").to(torch.bfloat16)
    gt = torch.randn(T, Hq, 2, D, generator=g, device="cuda").to(torch.bfloat16)[:, :, 1]
    cu = torch.tensor([0] + list(np.cumsum(q_lens)), dtype=torch.int32, device="cuda")
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    return dict(Hq=Hq, Hkv=Hkv, D=D, bs=bs, kc=kc, vc=vc, bt=bt, q=q, gt=gt, cu=cu, sl=sl, T=T, N=len(lens))


MODES = ["workspace", "workspace+warmup", "default+warmup", "plan+workspace", "plan+default+warmup"]


@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("mode", MODES)
def test_tma_prefill_capture_on_any_stream(api, mode):
    """workspace: scratch from a PrefillWorkspace, no eager call before the capture; default+warmup: the context's
    default scratch, grown by an eager call on another stream, reused by the capture on a fresh stream."""
    from vkc_runtime.ops import attn as A
    kernels.clear_cache()  # fresh default scratch
    c = _prefill_case()
    assert A.prefill_uses_tma(c["kc"], gate=True)
    ws = A.prefill_workspace(c["T"], c["N"], c["Hq"], c["D"]) if "workspace" in mode else None
    if ws is not None:
        assert ws.scratch is not None and ws.scratch.nbytes > 0
    scale = c["D"] ** -0.5
    if mode.startswith("plan"):
        plan = A.PrefillPlan(c["cu"], c["sl"], c["bt"], num_q_heads=c["Hq"], num_kv_heads=c["Hkv"], head_dim=c["D"],
                             block_size=c["bs"], workspace=ws)

        def call(o, stream):
            plan.run(c["q"], c["kc"], c["vc"], scale, gate=c["gt"], out=o, stream=stream)
    else:
        def call(o, stream):
            A.prefill(c["q"], c["kc"], c["vc"], c["bt"], c["cu"], c["sl"], scale, gate=c["gt"], out=o, workspace=ws,
                      stream=stream)
    shape = (c["T"], c["Hq"], c["D"])
    warm = torch.full(shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    if "warmup" in mode:
        _on_side_stream(lambda s: call(warm, s))
    poison = (lambda: ws.scratch.buffer.fill_bytes(0xFF)) if ws is not None else None
    eager = _replays_equal_eager(api, call, shape, poison)
    if "warmup" in mode:
        assert _same_bytes(warm, eager)


def test_capture_without_workspace_or_warmup_is_a_clear_error():
    """No workspace and a default scratch too small for the launch: refused before the launch, with the repair
    (the capture is aborted cleanly and the stream stays usable)."""
    from vkc_runtime.ops import attn as A
    kernels.clear_cache()
    c = _prefill_case(seed=1)
    kernels.get_kernel("attn.prefill.d256.gate.tma").load()  # only the scratch is missing, not the module
    out = torch.empty(c["T"], c["Hq"], c["D"], dtype=torch.bfloat16, device="cuda")
    s = vr.Stream()
    g = vr.Graph()
    torch.cuda.synchronize()
    with pytest.raises(vr.LaunchError, match="cannot grow during stream capture.*workspace allocated before capture"):
        with g.capture(s):
            A.prefill(c["q"], c["kc"], c["vc"], c["bt"], c["cu"], c["sl"], c["D"] ** -0.5, gate=c["gt"], out=out,
                      stream=s)
    assert not g.ready and not vr.is_capturing(s)
    A.prefill(c["q"], c["kc"], c["vc"], c["bt"], c["cu"], c["sl"], c["D"] ** -0.5, gate=c["gt"], out=out, stream=s)
    s.synchronize()
    assert torch.isfinite(out.float()).all()


# ------------------------------------------------------------------------------------------------- decode
@pytest.mark.parametrize("api", APIS)
@pytest.mark.parametrize("how", ["decode+workspace", "plan+own-workspace"])
@pytest.mark.parametrize("splits,fused", [(1, None), (8, True), (8, False)], ids=["direct", "fused", "combine"])
@pytest.mark.parametrize("bs", [16, 64], ids=["gather", "tma"])
def test_decode_capture_without_warmup(api, how, splits, fused, bs):
    """decode_workspace and DecodePlan load every decode kernel when they are made: after kernels.clear_cache()
    (no kernel loaded in this context's cache) a capture with no eager call before it works -- a module load
    inside it would fail the capture -- and its replays give the bytes of an eager call made afterwards.
    plan+own-workspace: a DecodeWorkspace built by hand (loads nothing), so only the plan loads. Block size 64
    with decode_workspace: the TMA kernels, their descriptors in the workspace's scratch (poisoned before every
    replay); a hand-built workspace without scratch keeps the gather kernels."""
    from vkc_runtime import memory
    from vkc_runtime.ops import attn as A
    kernels.clear_cache()
    Hq, Hkv, D = 24, 4, 256
    lens = [17, 300, 1030]
    B = len(lens)
    g = torch.Generator(device="cuda").manual_seed(11)
    nblk = max(-(-L // bs) for L in lens)
    nb = B * nblk + 2
    kc = torch.randn(nb, bs, Hkv, D, generator=g, device="cuda").to(torch.bfloat16)
    vc = torch.randn(nb, bs, Hkv, D, generator=g, device="cuda").to(torch.bfloat16)
    bt = torch.randperm(nb, generator=g, device="cuda")[:B * nblk].to(torch.int32).view(B, nblk).contiguous()
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(B, Hq, D, generator=g, device="cuda").to(torch.bfloat16)
    gt = torch.randn(B, Hq, 2, D, generator=g, device="cuda").to(torch.bfloat16)[:, :, 1]
    scale, max_len, ms = D ** -0.5, nblk * bs, 16
    if how == "plan+own-workspace":
        ws = A.DecodeWorkspace(memory.DeviceArray.empty((B * Hq * ms * D,), "float32"),
                               memory.DeviceArray.empty((B * Hq * ms,), "float32"),
                               memory.DeviceArray.zeros((B * Hq,), "int32"), B, Hq, D, ms)
        plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=bs, workspace=ws,
                            max_seq_len=max_len, num_splits=splits, fused=fused)

        assert not plan.batch.tma

        def call(o, stream):
            plan.run(q, kc, vc, scale, gate=gt, out=o, stream=stream)
    else:
        ws = A.decode_workspace(B, Hq, D, max_splits=ms, num_kv_heads=Hkv)
        probe = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=bs, workspace=ws,
                             max_seq_len=max_len, num_splits=splits, fused=fused)
        assert probe.batch.tma == (bs == 64) and (ws.scratch is not None)

        def call(o, stream):
            A.decode(q, kc, vc, bt, sl, scale, gate=gt, out=o, workspace=ws, max_seq_len=max_len, num_splits=splits,
                     fused=fused, stream=stream)
    shape = (B, Hq, D)
    poison = (lambda: ws.scratch.buffer.fill_bytes(0xFF)) if ws.scratch is not None else None
    _replays_equal_eager(api, call, shape, poison)



def test_leftovers_are_not_collected_inside_a_capture():
    """Objects left over from earlier work (a vkc stream, graph, device memory and engine backend with its pinned
    staging ring, a torch CUDA graph), reachable only through a reference cycle, with the collector's threshold
    at 1 so that any allocation inside the capture would run it: the capture keeps the collector off
    (vkc_runtime.deferred), so none of their finalizers runs inside it, the capture succeeds and replays like the
    eager call, and they are collected after it. (With the collector on, the collection of such leftovers in the
    middle of a capture invalidated a 35B-A3B engine's decode capture on the H200.)"""
    import gc
    import weakref

    from vkc_engine.backend import VkcBackend
    from vkc_runtime.ops import norm

    x = torch.randn(64, 1024, device="cuda").to(torch.bfloat16)
    w = torch.randn(1024, device="cuda").to(torch.bfloat16)
    ref = torch.empty_like(x)
    norm.rmsnorm(x, w, 1e-6, out=ref)
    torch.cuda.synchronize()

    def leftovers():
        be = VkcBackend()
        host = np.arange(1 << 16, dtype=np.float32)
        be.upload_into(be.empty((host.size,), "f32"), host)  # allocates the pinned staging ring
        s = vr.Stream()
        g = vr.Graph()
        with g.capture(s):
            norm.rmsnorm(x, w, 1e-6, out=torch.empty_like(x), stream=s.handle)
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            y = torch.empty_like(x)
            norm.rmsnorm(x, w, 1e-6, out=y, stream=torch.cuda.current_stream().cuda_stream)
        s.synchronize()
        be.synchronize()
        junk = {"be": be, "s": s, "g": g, "buf": vr.DeviceArray.empty((1 << 20,), "float32"), "tg": tg, "y": y}
        junk["self"] = junk  # a cycle: once the caller drops it, only the cycle collector frees it
        return junk, [weakref.ref(o) for o in (be, s, g, junk["buf"], tg)]

    thresholds = gc.get_threshold()
    junk, refs = leftovers()
    out = torch.full_like(x, float("nan"))
    s = vr.Stream()
    g = vr.Graph()
    try:
        with g.capture(s):
            del junk  # now reachable only through its cycle
            gc.set_threshold(1, 1, 1)
            norm.rmsnorm(x, w, 1e-6, out=out, stream=s.handle)
            more = [[i] for i in range(1000)]  # allocations: with the collector on, each would run it
            alive_inside = all(r() is not None for r in refs)
            collector_on = gc.isenabled()
    finally:
        gc.set_threshold(*thresholds)
    del more
    g.replay(s)
    s.synchronize()
    assert alive_inside and not collector_on and gc.isenabled()
    assert _same_bytes(out, ref)
    gc.collect()
    assert all(r() is None for r in refs)  # collected after the capture
