"""vkc_engine's decode graphs on the CPU (runtime/vkc_engine/graphs.py): the bucket rule, the padding rows, and
the engine's graph path on the float32 numpy backend with a stand-in "graph" (the captured closure, re-run on
replay: like a CUDA graph it reads whatever the fixed metadata buffers hold at replay time). The CUDA side is
tests/gpu/test_gpu_engine.py."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import numpy as np
import pytest

from tests.engine_fixtures import HEADS_27B, make_checkpoint
from tests.engine_numpy_backend import NumpyBackend

pytest.importorskip("transformers")

from vkc_engine import LLM, SamplingParams  # noqa: E402
from vkc_engine.graphs import FIELDS, DecodeLayout, bucket_for, bucket_sizes  # noqa: E402
from vkc_engine.model import host_step_arrays  # noqa: E402


class NumpyGraphBackend(NumpyBackend):
    """The numpy backend with the backend's graph methods: capture records the closure without running it,
    replay runs it (reading the metadata buffers' current contents)."""
    supports_graphs = True

    def __init__(self):
        super().__init__()
        self.in_graph_ops = False
        self.captured, self.replayed, self.released = [], [], []

    def graph_ops(self):
        @contextlib.contextmanager
        def ctx():
            self.in_graph_ops = True
            try:
                yield self
            finally:
                self.in_graph_ops = False
        return ctx()

    def synchronize(self):
        pass

    def segment(self, x, start, n):
        return x[start:start + n]

    def capture(self, fn):
        assert self.in_graph_ops, "captured outside graph_ops(): the warm-up and the capture would differ"
        g = SimpleNamespace(fn=fn, n=len(self.captured))
        self.captured.append(g)
        return g

    def replay(self, g):
        assert g not in self.released
        self.replayed.append(g.n)
        g.fn()

    def release_graph(self, g):
        self.released.append(g)

    def profile_start(self):  # the profiling hooks (CUDA events on the real backend): calls counted per op
        self.prof = len(self.calls)

    def profile_mark(self):
        pass

    def profile_stop(self, replay=None):
        if replay is not None:
            replay()
        n, self.prof = self.prof, None
        out = {}
        for c in self.calls[n:]:
            out.setdefault(c, [0.0, 0])[1] += 1
        return out


@pytest.fixture(scope="module")
def ck(tmp_path_factory):
    d = tmp_path_factory.mktemp("graphs")
    make_checkpoint(d, heads=HEADS_27B, seed=9)
    return d


def _llm(d, backend, **kw):
    args = dict(backend=backend, max_num_seqs=6, max_num_batched_tokens=48, max_model_len=160, num_blocks=60,
                block_size=16)
    args.update(kw)
    return LLM(d, **args)


# ------------------------------------------------------------------------------------------ bucket rule
def test_bucket_sizes():
    assert bucket_sizes(1) == (1,)
    assert bucket_sizes(3) == (1, 2, 3)
    assert bucket_sizes(8) == (1, 2, 4, 8)
    assert bucket_sizes(20) == (1, 2, 4, 8, 16, 20)
    assert bucket_sizes(32) == (1, 2, 4, 8, 16, 24, 32)
    assert bucket_sizes(64) == (1, 2, 4, 8, 16, 24, 32, 48, 64)
    assert bucket_sizes(100) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 100)
    assert bucket_sizes(256)[-3:] == (224, 240, 256)
    with pytest.raises(ValueError):
        bucket_sizes(0)


def test_bucket_for():
    b = bucket_sizes(48)
    assert [bucket_for(n, b) for n in (1, 2, 3, 5, 9, 16, 17, 25, 33, 48)] == [1, 2, 4, 8, 16, 16, 24, 32, 48, 48]
    assert bucket_for(49, b) is None


# ------------------------------------------------------------------------------------------ padding rows
def test_decode_layout_fill_rows_touch_nothing():
    bs, mb = 16, 5
    chunks = [([11], 20, [3, 4], 2, "last"), ([12], 0, [7], 0, "last"), ([13], 33, [1, 2, 9], 5, "last")]
    lay = DecodeLayout(8, mb)
    assert all(off % 16 == 0 for off in lay.offsets.values()) and set(lay.offsets) == set(FIELDS)
    spans = sorted((lay.offsets[f], lay.offsets[f] + lay.sizes[f]) for f in FIELDS)
    assert all(a1 <= b0 for (_, a1), (b0, _) in zip(spans, spans[1:])) and spans[-1][1] <= lay.size  # disjoint
    arr = lay.host()
    arr[[lay.offsets[f] for f in FIELDS[:6]]] = 99  # stale values of an earlier step must be overwritten
    lay.fill(arr, chunks, bs)
    p = lay.views(arr)
    ref = host_step_arrays(chunks, bs, mb)  # the eager step builder: the real rows must be the same
    for k in ("ids", "positions", "slot_mapping", "seq_lens", "gdn_slots"):
        assert p[k].shape == (8,) and (p[k][:3] == ref[k]).all(), k
    assert (p["block_tables"][:3] == ref["block_tables"]).all() and p["block_tables"].shape == (8, mb)
    assert p["ids"].tolist() == [11, 12, 13, 0, 0, 0, 0, 0]
    assert p["slot_mapping"].tolist() == [4 * bs + 4, 7 * bs, 9 * bs + 1] + [-1] * 5
    assert p["seq_lens"].tolist() == [21, 1, 34, 0, 0, 0, 0, 0]
    assert p["gdn_slots"].tolist() == [2, 0, 5] + [-1] * 5
    assert (p["block_tables"][3:] == -1).all()
    assert p["positions"][3:].tolist() == [0] * 5
    assert p["logit_rows"].tolist() == list(range(8)) and p["cu_seqlens"].tolist() == list(range(9))
    lay.fill(arr, chunks[:1], bs)  # fewer rows next time: the rows of the earlier step become padding
    assert p["gdn_slots"].tolist() == [2] + [-1] * 7 and (p["block_tables"][1:] == -1).all()
    assert p["slot_mapping"].tolist() == [4 * bs + 4] + [-1] * 7
    lay3 = DecodeLayout(3, mb)
    a3 = lay3.host()
    lay3.fill(a3, chunks, bs)  # an exact bucket: nothing added
    assert lay3.views(a3)["ids"].tolist() == [11, 12, 13]
    with pytest.raises(ValueError):
        DecodeLayout(2, mb).fill(DecodeLayout(2, mb).host(), chunks, bs)
    with pytest.raises(ValueError):  # not a decode step
        lay.fill(arr, [([1, 2], 0, [0], 0, "last")], bs)


# ------------------------------------------------------------------------------------------ the engine
def _prompts(V):
    rng = np.random.default_rng(3)
    return [[int(t) for t in rng.integers(0, V, n)] for n in (5, 17, 1, 30, 9)]


def _params():  # different lengths: the batch shrinks 5 -> 1 rows (buckets 6 and 4 pad)
    return [SamplingParams(temperature=0, max_tokens=m, ignore_eos=True) for m in (3, 7, 5, 10, 8)] + \
        [SamplingParams(temperature=0.9, top_p=0.8, seed=5, max_tokens=6, ignore_eos=True)]


def test_generate_with_graphs_equals_eager(ck):
    be = NumpyGraphBackend()
    g = _llm(ck, be)
    assert g.graphs is not None and g.graphs.buckets == (1, 2, 4, 6)
    assert len(be.captured) == 4
    e = _llm(ck, NumpyGraphBackend(), enforce_eager=True)
    assert e.graphs is None
    V = g.cfg.vocab_size
    prompts = _prompts(V) + [_prompts(V)[1]]
    got = g.generate(prompts, _params())
    want = e.generate(prompts, _params())
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    used = {g.graphs.buckets[n] for n in be.replayed}
    assert {6, 4, 1} <= used, used  # padded replays (5 -> 6, 3 -> 4) and exact ones
    assert not e.backend.replayed and not e.backend.captured


def test_padding_rows_touch_no_cache_state(ck):
    be = NumpyGraphBackend()
    llm = _llm(ck, be)
    sp = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for p in _prompts(llm.cfg.vocab_size)[:3]:
        llm.add_request(p, sp)
    llm.step()  # the prefill of all three
    running = list(llm.scheduler.running)
    assert len(running) == 3
    kv0 = {i: (k.copy(), v.copy()) for i, (k, v) in llm.cache.kv.items()}
    gdn0 = {i: (s.copy(), c.copy()) for i, (s, c) in llm.cache.gdn.items()}
    n0 = len(be.replayed)
    llm.step()  # a decode step of 3 rows: bucket 4, one padding row
    assert len(be.replayed) == n0 + 1 and llm.graphs.buckets[be.replayed[-1]] == 4
    slots = {s.slot for s in running}
    bsz = llm.plan.block_size
    kv_slots = {s.block_table[(s.num_computed - 1) // bsz] * bsz + (s.num_computed - 1) % bsz for s in running}
    for i, (k, v) in llm.cache.kv.items():
        for now, before in ((k, kv0[i][0]), (v, kv0[i][1])):
            a, b = now.reshape(-1, *now.shape[2:]), before.reshape(-1, *before.shape[2:])
            changed = {j for j in range(a.shape[0]) if not np.array_equal(a[j], b[j], equal_nan=True)}
            assert changed == kv_slots
    for i, (st, cv) in llm.cache.gdn.items():
        for now, before in ((st, gdn0[i][0]), (cv, gdn0[i][1])):
            changed = {j for j in range(now.shape[0]) if not np.array_equal(now[j], before[j])}
            assert changed == slots


def test_only_pure_decode_steps_replay(ck):
    llm = _llm(ck, NumpyGraphBackend())
    gr = llm.graphs
    assert gr.bucket([([1], 5, [0], 0, "last")] * 3) == 4
    assert gr.bucket([([1], 5, [0], 0, "last")] * 6) == 6
    assert gr.bucket([([1], 5, [0], 0, "last")] * 7) is None  # above the largest bucket: eager
    assert gr.bucket([([1], 5, [0], 0, "last"), ([1, 2], 0, [1], 1, "last")]) is None  # mixed
    assert gr.bucket([([1], 5, [0], 0, None)]) is None  # a one-token prefill chunk that is not sampled
    assert gr.bucket([]) is None


def test_enforce_eager_and_backends_without_graphs(ck):
    be = NumpyGraphBackend()
    llm = _llm(ck, be, enforce_eager=True)
    assert llm.graphs is None and not be.captured
    plain = _llm(ck, NumpyBackend())  # supports_graphs = False: the eager path, nothing asked of the backend
    assert plain.graphs is None
    out = plain.generate([3, 4, 5], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3


class _RejectingCapture(NumpyGraphBackend):
    def capture(self, fn):
        raise RuntimeError("cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED (901)")


def test_a_rejected_capture_falls_back_to_eager_unless_strict(ck):
    logs = []
    llm = _llm(ck, _RejectingCapture(), log=logs.append)
    assert llm.graphs is None and any("capture failed" in m for m in logs)
    out = llm.generate([3, 4, 5], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]
    assert len(out.token_ids) == 3
    with pytest.raises(RuntimeError, match="INVALIDATED"):
        _llm(ck, _RejectingCapture(), strict_graphs=True)


def test_close_releases_every_graph(ck):
    be = NumpyGraphBackend()
    llm = _llm(ck, be)
    llm.close()
    assert llm.graphs is None and len(be.released) == len(be.captured) == 4
    out = llm.generate([3, 4, 5], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0]  # eager now
    assert len(out.token_ids) == 3 and not be.replayed


def test_cli_enforce_eager_reaches_the_engine(ck, monkeypatch):
    from click.testing import CliRunner

    import vkc_engine
    import vkc_engine.backend as B
    from vkc_cli.main import main
    seen = []
    real = vkc_engine.LLM

    def spy(*a, **kw):
        seen.append(kw.get("enforce_eager"))
        return real(*a, **kw)
    monkeypatch.setattr(B, "VkcBackend", NumpyGraphBackend)
    monkeypatch.setattr(vkc_engine, "LLM", spy)
    base = ["generate", "--model", str(ck), "--prompt", "x", "--max-tokens", "2", "--max-model-len", "64",
            "--max-num-seqs", "2", "--max-num-batched-tokens", "32", "--load-format", "safetensors"]
    for extra, want in (([], False), (["--enforce-eager"], True)):
        r = CliRunner().invoke(main, base + extra)
        assert r.exit_code == 0, r.output
        assert seen[-1] is want


def test_bench_engine_options_on_the_numpy_backend(ck):
    from benchmarks.bench_engine import run
    res = run(ck, batches=(1, 3), prefill=20, long_prefill=40, steps=2, backend=NumpyGraphBackend(),
              load_format="safetensors", breakdown=True)
    assert res["graphs"] is True and res["prefill_long"]["tokens"] == 40 and res["prefill"]["tokens"] == 20
    pb = res["prefill_long"]["breakdown"]  # one eager prefill step: every layer's ops counted once
    assert pb["attn_prefill"][1] == 2 and pb["linear"][1] == 4 * 4 + 1 and "attn_decode" not in pb
    for d in res["decode"]:
        bd = d["breakdown"]
        assert "graph_error" not in bd, bd
        assert bd["eager"]["attn_decode"][1] == 2 and bd["graph"]["attn_decode"][1] == 2  # 2 attention layers
        assert bd["graph"]["linear"][1] == bd["eager"]["linear"][1] == 4 * 4 + 1  # 4 per layer + the LM head
    off = run(ck, batches=(2,), prefill=20, steps=2, backend=NumpyGraphBackend(), load_format="safetensors",
              graphs=False)
    assert off["graphs"] is False and "prefill_long" not in off and "breakdown" not in off["decode"][0]
