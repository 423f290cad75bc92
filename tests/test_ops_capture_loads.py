"""No kernel module is loaded inside a graph capture: the attention and GDN workspaces and the attention plans
load every kernel they can launch when they are made (a cuModuleLoadData during a capture fails it on a real
device).

Driver-free: memory, streams and graph capture go through the fake driver (tests/runtime_support.py FakeCu),
kernels through the ops tests' Recorder (tests/ops_fakes.py), whose kernels load on their first launch (or
``load()`` / ``max_active_blocks()``) like the real ones and fail a load while the fake driver has a stream
capturing."""
from __future__ import annotations

import pytest

from tests.ops_fakes import Dev, install_recorder
from vkc_runtime import Graph, Stream, memory
from vkc_runtime.ops import attn as A

try:
    from .runtime_support import clean_env, fake_cu  # noqa: F401
except ImportError:
    from runtime_support import clean_env, fake_cu  # noqa: F401

I32 = "<i4"
B, Hq, Hkv, D = 2, 8, 2, 256


@pytest.fixture()
def rec(monkeypatch, fake_cu):
    monkeypatch.setenv("VKC_FASTPATH", "0")  # every call validates: the capture sees the full op path
    r = install_recorder(monkeypatch, A)
    r.is_capturing = lambda: any(fake_cu.capturing.values())
    return r


def captured(fn):
    """Run ``fn(stream)`` inside a graph capture on a fresh stream."""
    s = Stream()
    with Graph().capture(s):
        fn(s)


def caches(bs):
    return Dev((64, bs, Hkv, D)), Dev((64, bs, Hkv, D))


def gate_view(n):  # the gate halves of a [n, Hq, 2, D] projection
    return Dev((n, Hq, D), strides=(Hq * 2 * D, 2 * D, 1), offset=D)


def test_the_recorder_refuses_a_load_inside_a_capture(rec):
    """The check itself: an op whose kernel was never loaded fails inside a capture (reshape_and_cache has no
    workspace; its kernel loads on first use, so warm it up eagerly before capturing)."""
    kc, vc = caches(16)
    args = (Dev((3, Hkv, D)), Dev((3, Hkv, D)), kc, vc, Dev((3,), I32))
    with pytest.raises(AssertionError, match="inside a graph capture"):
        captured(lambda s: A.reshape_and_cache(*args, stream=s))
    A.reshape_and_cache(*args)  # eager: loads
    captured(lambda s: A.reshape_and_cache(*args, stream=s))
    assert rec.loads == ["attn.reshape_and_cache.a16"]


@pytest.mark.parametrize("splits,fused", [(1, None), (4, True), (4, False)])
@pytest.mark.parametrize("bs", [16, 64])
def test_decode_workspace_loads_every_decode_kernel(rec, splits, fused, bs):
    """Block size 64 takes the TMA kernels (sm_90a), which the workspace loads beside the gather ones."""
    ws = A.decode_workspace(B, Hq, D, max_splits=8)
    assert set(rec.loads) == {b for b in A.BASES + A.OPTIONAL_BASES if b.startswith("attn.decode_") and f".d{D}" in b}
    assert any(b.endswith(".tma") for b in rec.loads) and ws.scratch is not None
    kc, vc = caches(bs)
    bt, sl = Dev((B, 32), I32), Dev((B,), I32)

    def step(s):
        for gate in (None, gate_view(B)):
            A.decode(Dev((B, Hq, D)), kc, vc, bt, sl, D ** -0.5, gate=gate, out=Dev((B, Hq, D)), workspace=ws,
                     max_seq_len=512, num_splits=splits, fused=fused, stream=s)
    captured(step)
    assert rec.calls, "the decode launches ran"
    attend = [c[0] for c in rec.calls if not c[0].startswith("attn.decode_combine")]
    assert attend and all(b.endswith(".tma") == (bs == 64) for b in attend), attend


def _hand_made_workspace():
    """A DecodeWorkspace not made by decode_workspace (so it loaded nothing)."""
    arr = lambda n, dt: memory.DeviceArray.empty((n,), dt)  # noqa: E731
    return A.DecodeWorkspace(arr(B * Hq * 8 * D, "float32"), arr(B * Hq * 8, "float32"), arr(B * Hq, "int32"),
                             B, Hq, D, 8)


@pytest.mark.parametrize("splits,fused", [(None, None), (1, None), (4, True), (4, False)])
def test_decode_plan_loads_what_run_can_launch(rec, splits, fused):
    bt, sl = Dev((B, 32), I32), Dev((B,), I32)
    plan = A.DecodePlan(bt, sl, num_q_heads=Hq, num_kv_heads=Hkv, head_dim=D, block_size=16,
                        workspace=_hand_made_workspace(), max_seq_len=512, num_splits=splits, fused=fused)
    kc, vc = caches(16)

    def layers(s):
        for gate in (None, gate_view(B), None):
            plan.run(Dev((B, Hq, D)), kc, vc, D ** -0.5, gate=gate, out=Dev((B, Hq, D)), stream=s)
    captured(layers)
    assert len(rec.calls) >= 3


@pytest.mark.parametrize("bs,workspace", [(16, False), (64, False), (64, True)])
def test_prefill_plan_loads_what_run_can_pick(rec, bs, workspace):
    """Block size 16 takes the gather kernel, 64 the TMA one (sm_90a); with a PrefillWorkspace the TMA kernel's
    scratch comes from it (without one, its scratch would come from the default arena: not this test's concern,
    the recorder's kernels need none)."""
    T, N = 40, 2
    ws = A.prefill_workspace(T, N, Hq, D) if workspace else None
    plan = A.PrefillPlan(Dev((N + 1,), I32), Dev((N,), I32), Dev((N, 20), I32), num_q_heads=Hq, num_kv_heads=Hkv,
                         head_dim=D, block_size=bs, workspace=ws)
    kc, vc = caches(bs)

    def layers(s):
        for gate in (None, gate_view(T)):
            plan.run(Dev((T, Hq, D)), kc, vc, D ** -0.5, gate=gate, out=Dev((T, Hq, D)), stream=s)
    captured(layers)
    want = "attn.prefill.d256.gate" + (".tma" if bs == 64 else "")
    assert rec.calls[-1][0] == want


def test_gdn_workspace_loads_the_five_kernels(monkeypatch, fake_cu):
    from vkc_runtime.ops import gdn as G
    r = install_recorder(monkeypatch, G)
    r.is_capturing = lambda: any(fake_cu.capturing.values())
    hk, hv, T, N = 16, 32, 100, 2
    ws = G.workspace_for(T, N, hk, hv)
    assert sorted(r.loads) == sorted(G.BASES)
    arr = lambda shape, dt: memory.DeviceArray.empty(shape, dt)  # noqa: E731
    qkv = arr((T, 2 * hk * 128 + hv * 128), "bfloat16")
    a, b = arr((T, hv), "bfloat16"), arr((T, hv), "bfloat16")
    A_log, dt = arr((hv,), "float32"), arr((hv,), "float32")
    cu, slot, state = arr((N + 1,), "int32"), arr((N,), "int32"), arr((3, hv, 128, 128), "float32")
    out = arr((T, hv, 128), "bfloat16")
    captured(lambda s: G.chunk_gated_delta_rule(qkv, a, b, A_log, dt, cu, hk, hv, state=state, slot_idx=slot,
                                                out=out, workspace=ws, stream=s))
    assert [c[0] for c in r.calls] == list(G.BASES)
