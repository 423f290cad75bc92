"""vkc_engine on the GPU (VkcBackend: vendored kernels only) against HF transformers' fp32 Qwen3_5ForCausalLM
and Qwen3_5MoeForCausalLM on tiny random checkpoints with the real head configurations (GDN 16/48 and 16/32 x
128, attention 24/4 and 16/2 x 256, partial RoPE 0.25; tests/engine_fixtures.py): teacher-forced logits at every
position (relative errors recorded as family "engine"), greedy continuations, a prompt alone vs inside a batch
of 32 mixed prompts, chunked vs unchunked prefill, preemption + recompute. The MoE case ("35b-a3b": 64 experts,
top-8, widths 256, shared expert folded; per-expert tensors VLM-wrapped, the released layout) needs
vkc_runtime.ops.moe and skips without it; its fused-layout twin must give the same logits bit for bit.

Greedy comparisons: tokens must agree up to the first divergence, and a divergence is accepted only where the
reference's own top-1 / top-2 margin at that step is within the measured numeric noise (twice the largest
|engine - HF| logit error of the teacher-forced comparison on the same sequence); the margin of every
divergence is recorded.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine_fixtures import hf_greedy, hf_logits, make_checkpoint
from tests.gpu.errlog import record

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")
pytest.importorskip("transformers")

REAL_HEADS = {
    "27b": dict(linear_num_key_heads=16, linear_num_value_heads=48, num_attention_heads=24, num_key_value_heads=4),
    "35b": dict(linear_num_key_heads=16, linear_num_value_heads=32, num_attention_heads=16, num_key_value_heads=2),
}
LAYERS = ["linear_attention", "full_attention", "linear_attention", "linear_attention", "full_attention"]
REL_TOL = 0.06  # max |engine - HF| / max |HF|; a bf16 emulation of the same math gives ~0.01 (see the report)
# MoE: bf16 activations can swap the experts at the top-k cut (a peaked router keeps their weight small); HF's own
# bf16 forward of the MoE checkpoint is at rel max 0.04-0.05, fro 0.02-0.03 (17 / 300 tokens, CPU)
MOE_REL_TOL, MOE_FRO_TOL = 0.12, 0.06
MOE = dict(num_experts=64, num_experts_per_tok=8, moe_intermediate_size=256, shared_expert_intermediate_size=256)
MAX_LEN = 2112


def _tols(name):
    return (MOE_REL_TOL, MOE_FRO_TOL) if name == "35b-a3b" else (REL_TOL, REL_TOL)


def _engine(d, **kw):
    from vkc_engine import LLM
    args = dict(max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=MAX_LEN, num_blocks=480, block_size=64,
                strict_graphs=True)
    args.update(kw)
    return LLM(d, **args)


def _need_moe_ops():
    try:
        from vkc_runtime.ops import moe  # noqa: F401
    except ImportError as e:
        pytest.skip(f"vkc_runtime.ops.moe (the MoE kernels) is not in this tree: {e}")
    try:
        from transformers import Qwen3_5MoeForCausalLM  # noqa: F401
    except ImportError as e:
        pytest.skip(f"this transformers has no Qwen3_5MoeForCausalLM (the reference): {e}")


def _moe_checkpoint(d, layout):
    return make_checkpoint(d, heads=REAL_HEADS["35b"], layer_types=LAYERS, hidden=512, moe=MOE, seed=13,
                           expert_layout=layout, vlm=layout == "per_expert")


@pytest.fixture(scope="module", params=sorted(REAL_HEADS) + ["35b-a3b"])
def setup(request, tmp_path_factory):
    try:
        from vkc_runtime.ops import gemm  # noqa: F401
    except ImportError:
        pytest.skip("vkc_runtime.ops.gemm (the BF16 GEMM the engine's projections need) is not in this tree")
    name = request.param
    d = tmp_path_factory.mktemp(f"engine_{name}")
    if name == "35b-a3b":
        _need_moe_ops()
        model, tok = _moe_checkpoint(d, "per_expert")
    else:
        model, tok = make_checkpoint(d, heads=REAL_HEADS[name], layer_types=LAYERS, hidden=512, intermediate=1024,
                                     seed=11 if name == "27b" else 12)
    return name, d, model, _engine(d)


def _prompt(n, V, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, V, n)]


def _first_divergence(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


def _margin(logits_row):
    top2 = np.sort(logits_row)[-2:]
    return float(top2[1] - top2[0])


def _noise(llm, model, seq):
    """Twice the largest |engine - HF| teacher-forced logit error over ``seq``."""
    return 2.0 * float(np.abs(llm.prompt_logits(seq) - hf_logits(model, seq)).max())


def check_teacher_forced(setup, n, tols, label="teacher-forced"):
    """Teacher-forced logits of an n-token random prompt vs HF's fp32 model: max and Frobenius relative error
    recorded and held to ``tols`` = (max, fro)."""
    name, _, model, llm = setup
    ids = _prompt(n, llm.cfg.vocab_size, 1000 + n)
    ref = hf_logits(model, ids)
    got = llm.prompt_logits(ids)
    assert got.shape == ref.shape and np.isfinite(got).all()
    d = got - ref
    rel = float(np.abs(d).max() / np.abs(ref).max())
    fro = float(np.linalg.norm(d) / np.linalg.norm(ref))
    record("engine", case=f"{name} {label} n={n}", rel_max=rel, rel_fro=fro, max_abs=float(np.abs(d).max()))
    assert rel < tols[0] and fro < tols[1]


@pytest.mark.parametrize("n", [1, 17, 300, 2000])
def test_teacher_forced_logits_vs_hf(setup, n):
    check_teacher_forced(setup, n, _tols(setup[0]))


@pytest.mark.parametrize("chunk", [64, 100, 517])
def test_chunked_prefill_vs_unchunked(setup, chunk):
    name, _, model, llm = setup
    ids = _prompt(1100, llm.cfg.vocab_size, 7)
    whole = llm.prompt_logits(ids)
    got = llm.prompt_logits(ids, chunk=chunk)
    ref = hf_logits(model, ids)
    rel_w = float(np.abs(got - whole).max() / np.abs(whole).max())
    rel_hf = float(np.abs(got - ref).max() / np.abs(ref).max())
    record("engine", case=f"{name} chunk={chunk} n=1100", rel_vs_unchunked=rel_w, rel_max=rel_hf)
    assert rel_w < _tols(name)[0] and rel_hf < _tols(name)[0]


def _check_greedy(case, got, want, margin_at, noise):
    j = _first_divergence(got, want)
    if j is None:
        record("engine", case=case, divergence=None, noise=noise)
        return
    m = margin_at(j)
    record("engine", case=case, divergence=j, margin=m, noise=noise)
    assert m <= noise, f"{case}: diverged at step {j} where the reference margin {m:.4f} exceeds the noise {noise:.4f}"


@pytest.mark.parametrize("n", [17, 300])
def test_greedy_32_vs_hf(setup, n):
    from vkc_engine import SamplingParams
    name, _, model, llm = setup
    ids = _prompt(n, llm.cfg.vocab_size, 2000 + n)
    want, margins = hf_greedy(model, ids, 32)
    out = llm.generate(ids, SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))[0]
    assert len(out.token_ids) == 32
    _check_greedy(f"{name} greedy32 n={n}", out.token_ids, want, lambda j: margins[j],
                  _noise(llm, model, ids + want))


def test_batch_of_32_mixed_equals_alone(setup):
    from vkc_engine import SamplingParams
    name, _, model, llm = setup
    rng = np.random.default_rng(5)
    lens = [1, 300, 2, 17] + [int(x) for x in rng.integers(1, 300, 28)]
    prompts = [_prompt(n, llm.cfg.vocab_size, 3000 + i) for i, n in enumerate(lens)]
    params = [SamplingParams(temperature=0, max_tokens=int(m), ignore_eos=True) for m in rng.integers(8, 24, 32)]
    batch = llm.generate(prompts, params)
    assert llm.scheduler.blocks.num_free == llm.plan.num_blocks and llm.scheduler.slots.num_free == llm.plan.num_slots
    noise = _noise(llm, model, prompts[1])
    for i in (0, 1, 2, 3, 9):
        alone = llm.generate(prompts[i], params[i])[0].token_ids
        got = batch[i].token_ids
        assert len(got) == len(alone) == params[i].max_tokens
        _check_greedy(f"{name} batch32 vs alone, prompt {i} (len {lens[i]})", got, alone,
                      lambda j: _margin(llm.prompt_logits(prompts[i] + alone[:j])[-1]), noise)


def test_preemption_recompute_same_tokens(setup):
    from vkc_engine import SamplingParams
    name, d, model, llm = setup
    small = _engine(d, max_num_seqs=8, max_num_batched_tokens=256, max_model_len=400, num_blocks=10)
    rng = np.random.default_rng(8)
    prompts = [_prompt(int(n), llm.cfg.vocab_size, 4000 + i) for i, n in enumerate(rng.integers(100, 200, 8))]
    sp = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = small.generate(prompts, sp)
    assert small.scheduler.num_preemptions > 0
    assert small.scheduler.blocks.num_free == 10
    noise = _noise(llm, model, prompts[0])
    for i, p in enumerate(prompts):
        alone = llm.generate(p, sp)[0].token_ids
        _check_greedy(f"{name} preempted prompt {i}", outs[i].token_ids, alone,
                      lambda j: _margin(llm.prompt_logits(p + alone[:j])[-1]), noise)


# ------------------------------------------------------------------------------------------ CUDA graphs
# The fixture's engine captures decode graphs for buckets 1, 2, 4, 8, 16, 24, 32 (vkc_engine.graphs). A replay
# must give the bytes the same padded step gives when run eagerly with the same op choices (graph_ops: small-M
# linear on ops.gemv), touch no cache state of the padding rows, read new metadata on every replay, and allocate
# nothing; the plain eager path (CuTe GEMM for every M) agrees within bf16 noise.

def _decode_batch(llm, n, seed):
    """n sequences prefilled eagerly on their own blocks and slots; returns their decode chunks (one new
    token each) and a release()."""
    sched, V = llm.scheduler, llm.cfg.vocab_size
    rng = np.random.default_rng(seed)
    chunks, tables, slots = [], [], []
    for i in range(n):
        L = int(rng.integers(1, 150))
        table, slot = [], sched.slots.take()
        sched.blocks.grow(table, L + 1)
        llm.cache.reset_slots([slot])
        llm._run([(_prompt(L, V, seed * 1000 + i), 0, table, slot, "last")])
        chunks.append(([int(rng.integers(0, V))], L, table, slot, "last"))
        tables.append(table)
        slots.append(slot)

    def release():
        for t in tables:
            sched.blocks.release(t)
        for s in slots:
            sched.slots.release(s)
    return chunks, release


def _state_arrays(llm):
    return [a for pair in llm.cache.gdn.values() for a in pair]


def _snapshot(llm):
    """Device copies of every GDN state array (restore with _restore)."""
    be = llm.backend
    out = []
    for a in _state_arrays(llm):
        b = be.empty(a.shape, "f32" if a.dtype_name == "float32" else "bf16")
        b.copy_from(a, stream=be._s)
        out.append((a, b))
    return out


def _restore(llm, snap):
    for a, b in snap:
        a.copy_from(b, stream=llm.backend._s)


def _host_bits(be, a):
    return be.to_host(a).view(np.uint32).copy()


def _kv_bits(llm):
    return [_host_bits(llm.backend, a) for pair in llm.cache.kv.values() for a in pair]


def _logits_rows(llm, n):
    be = llm.backend
    return be.to_host(be.rows(llm.model.bufs["logits"], n))


def _eager_padded(llm, chunks, B):
    """The step the bucket's graph runs, run eagerly with the graph's op choices."""
    g, be = llm.graphs, llm.backend
    g.write(chunks, B)
    with be.graph_ops():
        llm.model.forward(llm.cache, g._step(B))
    return _logits_rows(llm, len(chunks))


@pytest.mark.parametrize("n", [1, 3, 5, 16, 17, 32])
def test_graph_replay_equals_eager(setup, n):
    from vkc_engine.graphs import bucket_for
    name, _, _, llm = setup
    be, g = llm.backend, llm.graphs
    assert g is not None and g.buckets == (1, 2, 4, 8, 16, 24, 32)
    B = bucket_for(n, g.buckets)
    chunks, release = _decode_batch(llm, n, seed=50 + n)
    try:
        snap = _snapshot(llm)
        s0 = [_host_bits(be, a) for a in _state_arrays(llm)]
        kv0 = _kv_bits(llm)
        eager = _eager_padded(llm, chunks, B)
        s_eager = [_host_bits(be, a) for a in _state_arrays(llm)]
        _restore(llm, snap)
        be.rows(llm.model.bufs["logits"], B).fill_bytes(0xFF, stream=be._s)  # NaN: the replay must write it
        graph = be.to_host(g.run(chunks, B))
        s_graph = [_host_bits(be, a) for a in _state_arrays(llm)]
        kv_graph = _kv_bits(llm)
        assert np.isfinite(graph).all() and graph.shape == (n, llm.cfg.vocab_size)
        assert np.array_equal(graph.view(np.uint32), eager.view(np.uint32)), "graph replay != eager (same step)"
        used = sorted({c[3] for c in chunks})
        for a0, ae, ag in zip(s0, s_eager, s_graph):
            assert np.array_equal(ae, ag), "GDN state after the replay != after the eager step"
            rest = np.setdiff1d(np.arange(a0.shape[0]), used)
            assert np.array_equal(ag[rest], a0[rest]), "a padding row wrote a GDN/conv state slot"
            assert not np.array_equal(ag[used], a0[used])
        bs = llm.plan.block_size
        written = {c[2][c[1] // bs] * bs + c[1] % bs for c in chunks}
        for before, after in zip(kv0, kv_graph):
            flat_b, flat_a = before.reshape(-1, before[0, 0].size), after.reshape(-1, after[0, 0].size)
            changed = set(np.flatnonzero((flat_b != flat_a).any(axis=1)).tolist())
            assert changed <= written, "a padding row wrote the KV cache"
        _restore(llm, snap)
        plain = be.to_host(llm._run(chunks))  # the eager path: CuTe GEMM at every M, B = n
        rel = float(np.abs(plain - graph).max() / np.abs(plain).max())
        record("engine", case=f"{name} graph vs eager decode n={n} bucket={B}", rel_max=rel)
        assert rel < 0.03
    finally:
        release()


def test_graph_replay_reads_new_inputs(setup):
    name, _, _, llm = setup
    be, g = llm.backend, llm.graphs
    chunks, release = _decode_batch(llm, 5, seed=77)
    try:
        other = [([(c[0][0] + 1 + i) % llm.cfg.vocab_size], c[1], c[2], c[3], c[4]) for i, c in enumerate(chunks)]
        snap = _snapshot(llm)
        a = be.to_host(g.run(chunks, 8))
        _restore(llm, snap)
        b = be.to_host(g.run(other, 8))
        _restore(llm, snap)
        b_eager = _eager_padded(llm, other, 8)
        _restore(llm, snap)
        a2 = be.to_host(g.run(chunks, 8))
        _restore(llm, snap)
        assert np.array_equal(a.view(np.uint32), a2.view(np.uint32))
        assert np.array_equal(b.view(np.uint32), b_eager.view(np.uint32))
        assert all(not np.array_equal(a[i], b[i]) for i in range(5))
        # a replay after an eager step of another size still reads the current buffers
        llm._run(chunks[:2])
        _restore(llm, snap)
        a3 = be.to_host(g.run(chunks, 8))
        assert np.array_equal(a.view(np.uint32), a3.view(np.uint32))
    finally:
        release()


def _free_after_gc(be):
    import gc
    gc.collect()  # arrays of earlier tests freed now, not inside the measured window
    be.synchronize()
    return be.free_memory()[0]


def test_replays_allocate_nothing(setup):
    _, _, _, llm = setup
    be, g = llm.backend, llm.graphs
    chunks, release = _decode_batch(llm, 3, seed=91)
    try:
        snap = _snapshot(llm)
        for B in (4, 8, 32):
            g.run(chunks, B)
        _restore(llm, snap)
        free0 = _free_after_gc(be)
        for _ in range(20):
            _restore(llm, snap)
            for B in (4, 8, 32):
                g.run(chunks, B)
        be.synchronize()
        assert be.free_memory()[0] >= free0  # nothing allocated (a late free elsewhere may only add)
    finally:
        release()


def _count_replays(llm):
    used = []
    run = llm.graphs.run

    def counted(chunks, bucket, patch=None):
        used.append((len(chunks), bucket))
        return run(chunks, bucket, patch)
    llm.graphs.run = counted
    return used


def _graphs_vs_eager(case, graphs_llm, eager_llm, prompts, params, noise, check_memory=False):
    used = _count_replays(graphs_llm)
    if check_memory:  # the same run once first: every bucket replayed, the sampler's buffers made
        graphs_llm.generate(prompts, params)
        free0 = _free_after_gc(graphs_llm.backend)
    got = graphs_llm.generate(prompts, params)
    if check_memory:
        graphs_llm.backend.synchronize()
        assert graphs_llm.backend.free_memory()[0] >= free0, "a generate() with graph replays allocated"
    want = eager_llm.generate(prompts, params)
    for i, p in enumerate(prompts):
        assert len(got[i].token_ids) == len(want[i].token_ids) == params[i].max_tokens
        w = want[i].token_ids
        _check_greedy(f"{case} prompt {i}", got[i].token_ids, w,
                      lambda j: _margin(eager_llm.prompt_logits(p + w[:j])[-1]), noise)
    return used


def test_generate_with_graphs_equals_enforce_eager(setup):
    from vkc_engine import SamplingParams
    name, d, model, llm = setup
    eager = _engine(d, enforce_eager=True)
    assert eager.graphs is None
    rng = np.random.default_rng(21)
    prompts = [_prompt(int(n), llm.cfg.vocab_size, 6000 + i) for i, n in enumerate(rng.integers(1, 200, 21))]
    params = [SamplingParams(temperature=0, max_tokens=int(m), ignore_eos=True) for m in rng.integers(4, 30, 21)]
    used = _graphs_vs_eager(f"{name} graphs vs eager", llm, eager, prompts, params, _noise(llm, model, prompts[0]))
    assert used and any(n < b for n, b in used), used  # padded replays ran
    assert llm.scheduler.blocks.num_free == llm.plan.num_blocks


def test_graphs_after_preemption(setup):
    from vkc_engine import SamplingParams
    name, d, model, llm = setup
    kw = dict(max_num_seqs=8, max_num_batched_tokens=256, max_model_len=400, num_blocks=10)
    small, small_eager = _engine(d, **kw), _engine(d, enforce_eager=True, **kw)
    assert small.graphs.buckets == (1, 2, 4, 8)
    rng = np.random.default_rng(8)
    prompts = [_prompt(int(n), llm.cfg.vocab_size, 4000 + i) for i, n in enumerate(rng.integers(100, 200, 8))]
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)] * 8
    noise = _noise(llm, model, prompts[0])
    used = _graphs_vs_eager(f"{name} graphs after preemption", small, small_eager, prompts, params, noise,
                            check_memory=True)
    assert small.scheduler.num_preemptions > 0 and small_eager.scheduler.num_preemptions > 0
    assert any(n < b for n, b in used), used
    assert small.scheduler.blocks.num_free == 10
    small.close()
    assert small.graphs is None


def test_overlapped_steps_equal_steps_one_by_one(setup):
    """LLM async_scheduling (each step queued before the last one's draws are read, its decode rows fed from them
    on the device) against the same engine running steps one by one: every request stops by length, so both
    modes schedule the same rows into the same buckets and must draw the very same tokens (greedy, seeded
    top-p / top-k / min-p, penalties, log-probabilities); a stop on a token ends at the same token."""
    from vkc_engine import SamplingParams
    name, d, model, llm = setup
    V = llm.cfg.vocab_size
    rng = np.random.default_rng(31)
    prompts = [_prompt(int(n), V, 7000 + i) for i, n in enumerate(rng.integers(1, 150, 10))]
    kinds = [dict(temperature=0), dict(temperature=0.8, top_p=0.9, seed=1), dict(temperature=0.7, top_k=20, seed=2),
             dict(temperature=1.0, min_p=0.1, seed=3, repetition_penalty=1.2, frequency_penalty=0.3),
             dict(temperature=0, logprobs=5)]
    params = [SamplingParams(max_tokens=int(m), ignore_eos=True, **kinds[i % len(kinds)])
              for i, m in enumerate(rng.integers(3, 14, 10))]
    runs = {}
    for overlap in (False, True):
        llm.async_scheduling = overlap
        n0 = llm.num_ahead_steps
        runs[overlap] = [(o.token_ids, o.finish_reason, None if o.logprobs is None else
                          [(lp.token_id, lp.logprob, lp.top) for lp in o.logprobs])
                         for o in llm.generate(prompts, params)]
        assert (llm.num_ahead_steps > n0) == overlap
        assert llm.scheduler.blocks.num_free == llm.plan.num_blocks
    assert runs[True] == runs[False], name
    llm.async_scheduling = False
    base = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=13, ignore_eos=True))[0].token_ids
    llm.async_scheduling = True
    got = llm.generate(prompts[0], SamplingParams(temperature=0, max_tokens=13, ignore_eos=True,
                                                 stop_token_ids=[base[4]]))[0]
    assert got.finish_reason == "stop" and got.token_ids == base[:base.index(base[4]) + 1]


@pytest.mark.parametrize("mode", ["eager", "graph"])
def test_step_breakdown_per_family(setup, mode):
    """The per-kernel-family timing of benchmarks/bench_engine.py --breakdown: CUDA events before each op of an
    eager step (eager), event nodes inside a captured step, replayed once (graph)."""
    _, _, _, llm = setup
    be, g = llm.backend, llm.graphs
    chunks, release = _decode_batch(llm, 3, seed=93)
    try:
        snap = _snapshot(llm)
        if mode == "eager":
            be.profile_start()
            llm._run(chunks)
            fams = be.profile_stop()
        else:
            fams = g.profile(chunks)
        _restore(llm, snap)
        n_attn, n_gdn = len(llm.cfg.layer_indices("full_attention")), len(llm.cfg.layer_indices("linear_attention"))
        assert fams["attn_decode"][1] == n_attn and fams["gdn_decode"][1] == n_gdn, fams
        L = llm.cfg.num_layers
        if llm.cfg.is_moe:  # mixer in/out per layer, the LM head; one MoE block per layer
            assert fams["linear"][1] == 2 * L + 1 and fams["moe"][1] == L, fams
        else:  # mixer in/out + MLP gate_up/down, the LM head
            assert fams["linear"][1] == 4 * L + 1, fams
        assert all(ms >= 0 for ms, _ in fams.values()) and sum(ms for ms, _ in fams.values()) > 0
        assert "attn_prefill" not in fams and "sample" not in fams
        assert be._prof is None and "linear" not in be.__dict__  # profiling is off again
    finally:
        release()


def test_moe_fused_layout_gives_the_same_logits(setup, tmp_path):
    """The same MoE weights stored fused and text-only load into the same w1 / w2: the same logits (as close as
    the engine's own run-to-run difference, zero for deterministic kernels)."""
    name, _, _, llm = setup
    if name != "35b-a3b":
        pytest.skip("MoE only")
    _moe_checkpoint(tmp_path, "fused")
    fused = _engine(tmp_path)
    ids = _prompt(600, llm.cfg.vocab_size, 77)
    a = fused.prompt_logits(ids)
    b, b2 = llm.prompt_logits(ids), llm.prompt_logits(ids)
    rerun = float(np.abs(b - b2).max())
    record("engine", case="35b-a3b fused vs per-expert layout n=600", max_abs=float(np.abs(a - b).max()),
           rerun_max_abs=rerun)
    assert float(np.abs(a - b).max()) <= rerun
