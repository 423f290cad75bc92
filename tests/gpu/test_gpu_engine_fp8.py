"""vkc_engine on block-wise FP8 checkpoints on the GPU (VkcBackend: ops.gemm_fp8's quantize_fp8_per_token_group +
linear_fp8_block for the FP8 linears), on tiny checkpoints with the real head configurations of
tests/gpu/test_gpu_engine.py quantized as Qwen's *-FP8 releases are (tests/engine_fixtures.py ``fp8=``: every
projection FP8 with 128 x 128 block scales except lm_head, embeddings, the router, the shared-expert gate and
in_proj_a; in_proj_b FP8 but dequantized at load; MoE experts and the shared expert FP8, kept FP8 on the device:
ops.moe's W8A16 expert kernels):

- teacher-forced logits vs HF transformers fp32 on the dequantized weights (no activation quantization): relative
  errors within FP8_REL_TOL / FP8_FRO_TOL (set from the numpy backend's FP8 emulation vs the same reference on
  CPU, see the constants), recorded as family "engine";
- the same vs the numpy-backend engine (ops.gemm_fp8's math in float32 / float64, tests/engine_numpy_backend.py);
- CUDA graph replay == the same padded step run eagerly, bit for bit;
- greedy continuations vs the numpy-backend engine, and graphs vs enforce_eager, with the divergence rule of
  tests/gpu/test_gpu_engine.py (a divergence only where the reference's top-1 / top-2 margin is within twice the
  largest teacher-forced logit difference between the two on that sequence);
- FP8_GEMV on and off (captured one-row steps' FP8 linears on gemv_w8a16 or the W8A8 GEMM): decode logits vs
  the W8A8 step, replay == eager.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine_fixtures import make_checkpoint
from tests.gpu.errlog import record
from tests.gpu.test_gpu_engine import (LAYERS, MOE, REAL_HEADS, _check_greedy, _decode_batch, _eager_padded, _engine,
                                       _graphs_vs_eager, _margin, _need_moe_ops, _noise, _prompt, _restore, _snapshot,
                                       check_teacher_forced)

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")
pytest.importorskip("transformers")

# max |engine - HF fp32| / max |HF| and the Frobenius ratio. The FP8 activation quantization (per token per 128
# columns, e4m3) is most of the error: the numpy backend's exact FP8 emulation vs the same HF reference on CPU
# (these fixtures, n = 1 / 17 / 300) measured rel max 0.074 / 0.082 / 0.086, fro 0.066 / 0.079 / 0.076 (27b) and
# rel max 0.089 / 0.094 / 0.155, fro 0.129 / 0.078 / 0.087 (35b-a3b); the GPU's bf16 activations add what
# tests/gpu/test_gpu_engine.py allows for (bf16 ~0.01-0.02 dense; MoE expert swaps at the top-k cut ~0.05), and
# n = 2000 takes the max over more rows.
FP8_REL_TOL, FP8_FRO_TOL = 0.2, 0.14
MOE_FP8_REL_TOL, MOE_FP8_FRO_TOL = 0.3, 0.2
# GPU vs the numpy FP8 engine: both quantize, but different activations (bf16 vs float32), so their quantization
# noise is drawn twice; a wiring error (a wrong scale block, a missing segment) is O(1)
VS_NUMPY = 1.5


def _tols(name):
    return (MOE_FP8_REL_TOL, MOE_FP8_FRO_TOL) if name == "35b-a3b" else (FP8_REL_TOL, FP8_FRO_TOL)


@pytest.fixture(scope="module", params=["27b", "35b-a3b"])
def setup(request, tmp_path_factory):
    try:
        from vkc_runtime.ops import gemm, gemm_fp8  # noqa: F401
    except ImportError:
        pytest.skip("vkc_runtime.ops.gemm / gemm_fp8 (the GEMMs of an FP8 checkpoint) are not in this tree")
    name = request.param
    d = tmp_path_factory.mktemp(f"engine_fp8_{name}")
    if name == "35b-a3b":
        _need_moe_ops()
        model, _ = make_checkpoint(d, heads=REAL_HEADS["35b"], layer_types=LAYERS, hidden=512, moe=MOE, seed=13,
                                   expert_layout="per_expert", vlm=True, fp8={})
    else:
        model, _ = make_checkpoint(d, heads=REAL_HEADS["27b"], layer_types=LAYERS, hidden=512, intermediate=1024,
                                   seed=11, fp8={})
    return name, d, model, _engine(d)


@pytest.fixture(scope="module")
def numpy_engine(setup):
    from tests.engine_numpy_backend import NumpyBackend
    from vkc_engine import LLM
    _, d, _, _ = setup
    return LLM(d, backend=NumpyBackend(), max_num_seqs=2, max_num_batched_tokens=512, max_model_len=400,
               num_blocks=8, block_size=64)


def test_fp8_weights_on_the_device(setup):
    from vkc_engine.backend import Fp8Weight
    from vkc_engine.model import _Segments
    name, _, _, llm = setup
    m = llm.model
    attn = m.layers[LAYERS.index("full_attention")].mixer
    gdn = m.layers[0].mixer
    assert isinstance(attn.qkv, Fp8Weight) and isinstance(attn.o, Fp8Weight)
    assert isinstance(gdn.in_proj, _Segments) and isinstance(gdn.in_proj.segs[0][0], Fp8Weight)
    assert [type(s[0]).__name__ for s in gdn.in_proj.segs] == ["Fp8Weight", "DeviceArray"]  # b (dequantized) | a
    assert isinstance(gdn.out, Fp8Weight) and not isinstance(m.lm_head, Fp8Weight)
    if name != "35b-a3b":
        assert isinstance(m.layers[0].mlp.gate_up, Fp8Weight) and isinstance(m.layers[0].mlp.down, Fp8Weight)
    else:
        from vkc_runtime.ops.moe import Fp8Experts
        assert all(isinstance(layer.mlp.w1, Fp8Experts) and isinstance(layer.mlp.w2, Fp8Experts)
                   for layer in m.layers)


@pytest.mark.parametrize("n", [1, 17, 300, 2000])
def test_teacher_forced_logits_vs_hf(setup, n):
    check_teacher_forced(setup, n, _tols(setup[0]), "fp8 teacher-forced")


@pytest.mark.parametrize("n", [17, 300])
def test_teacher_forced_logits_vs_numpy_engine(setup, numpy_engine, n):
    name, _, _, llm = setup
    ids = _prompt(n, llm.cfg.vocab_size, 1100 + n)
    ref = numpy_engine.prompt_logits(ids)
    got = llm.prompt_logits(ids)
    d = got - ref
    rel = float(np.abs(d).max() / np.abs(ref).max())
    fro = float(np.linalg.norm(d) / np.linalg.norm(ref))
    record("engine", case=f"{name} fp8 vs numpy FP8 engine n={n}", rel_max=rel, rel_fro=fro)
    tol_max, tol_fro = _tols(name)
    assert rel < VS_NUMPY * tol_max and fro < VS_NUMPY * tol_fro


def _decode_step_three_ways(llm, n, seed):
    """One decode step of n sequences: (the graph replay's logits, the same step eager with the graph's padding and
    kernels, the plain eager step -- the W8A8 GEMM for every FP8 linear --, the bucket)."""
    from vkc_engine.graphs import bucket_for
    be, g = llm.backend, llm.graphs
    assert g is not None
    B = bucket_for(n, g.buckets)
    chunks, release = _decode_batch(llm, n, seed=seed)
    try:
        snap = _snapshot(llm)
        eager = _eager_padded(llm, chunks, B)
        _restore(llm, snap)
        be.rows(llm.model.bufs["logits"], B).fill_bytes(0xFF, stream=be._s)  # NaN: the replay must write it
        graph = be.to_host(g.run(chunks, B))
        _restore(llm, snap)
        plain = be.to_host(llm._run(chunks))
        _restore(llm, snap)
    finally:
        release()
    return graph, eager, plain, B


@pytest.mark.parametrize("n", [1, 5, 17])
def test_graph_replay_equals_eager(setup, n):
    name, _, _, llm = setup
    graph, eager, plain, B = _decode_step_three_ways(llm, n, 150 + n)
    assert np.isfinite(graph).all() and graph.shape == (n, llm.cfg.vocab_size)
    assert np.array_equal(graph.view(np.uint32), eager.view(np.uint32)), "graph replay != eager (same step)"
    rel = float(np.abs(plain - graph).max() / np.abs(plain).max())
    record("engine", case=f"{name} fp8 graph vs eager decode n={n} bucket={B}", rel_max=rel)
    import vkc_engine.backend as BK
    if BK.FP8_GEMV and B <= BK.FP8_GEMV_MAX_M:  # the graph's FP8 linears are W8A16 (gemv_w8a16), the eager
        assert rel < _tols(name)[0]            # step's W8A8: test_fp8_gemv_decode_steps' FP8 tolerance
    else:
        assert rel < 0.03


def test_greedy_vs_numpy_engine(setup, numpy_engine):
    from vkc_engine import SamplingParams
    name, _, _, llm = setup
    ids = _prompt(17, llm.cfg.vocab_size, 2017)
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    want = numpy_engine.generate(ids, sp)[0].token_ids
    got = llm.generate(ids, sp)[0].token_ids
    assert len(got) == len(want) == 32
    seq = ids + want
    noise = 2.0 * float(np.abs(llm.prompt_logits(seq) - numpy_engine.prompt_logits(seq)).max())
    _check_greedy(f"{name} fp8 greedy32 vs numpy engine n=17", got, want,
                  lambda j: _margin(numpy_engine.prompt_logits(ids + want[:j])[-1]), noise)


def test_generate_with_graphs_equals_enforce_eager(setup, monkeypatch):
    """The captured engine generates what the eager one does, up to near-ties. Both run with FP8_GEMV off, so
    their FP8 linears do the same math (W8A8) in every step (W8A16 vs W8A8 is test_fp8_gemv_decode_steps'
    comparison, step by step). The graph's padded buckets still take other GEMM tiles than the eager step's
    rows, and an activation that rounds one bf16 ulp apart can land in another FP8 step: a difference far above
    one step's noise after a few steps (seen on an H100). So the noise is the bf16 test's rule: twice the
    engine's own error vs HF fp32, which for an FP8 model includes the activations' quantization."""
    import vkc_engine.backend as B
    from vkc_engine import SamplingParams
    name, d, model, _ = setup
    monkeypatch.setattr(B, "FP8_GEMV", False)
    llm = _engine(d)
    eager = _engine(d, enforce_eager=True)
    rng = np.random.default_rng(31)
    prompts = [_prompt(int(n), llm.cfg.vocab_size, 7000 + i) for i, n in enumerate(rng.integers(1, 200, 9))]
    params = [SamplingParams(temperature=0, max_tokens=int(m), ignore_eos=True) for m in rng.integers(4, 20, 9)]
    used = _graphs_vs_eager(f"{name} fp8 graphs vs eager", llm, eager, prompts, params, _noise(llm, model, prompts[0]))
    assert used and any(n < b for n, b in used), used


@pytest.mark.parametrize("n", [1, 5])
def test_fp8_gemv_decode_steps(setup, monkeypatch, n):
    """vkc_engine.backend.FP8_GEMV on: an engine whose captured decode steps run the FP8 linears of one row on
    gemv_w8a16 (W8A16) gives decode logits within the FP8 tolerance of the same step with FP8_GEMV off (W8A8:
    the difference is the activations' FP8 quantization, which W8A16 skips), finite, and its graph replay
    equals its eager padded step bit for bit. n = 5 (bucket 5 > FP8_GEMV_MAX_M): both take the W8A8 GEMM."""
    import vkc_engine.backend as B
    from vkc_engine.graphs import bucket_for
    name, d, _, _ = setup
    monkeypatch.setattr(B, "FP8_GEMV", False)
    llm = _engine(d)
    monkeypatch.setattr(B, "FP8_GEMV", True)
    on = _engine(d)
    g = on.graphs
    Bk = bucket_for(n, g.buckets)
    outs = {}
    for tag, eng in (("on", on), ("off", llm)):
        chunks, release = _decode_batch(eng, n, seed=190 + n)
        try:
            snap = _snapshot(eng)
            if tag == "on":
                eager = _eager_padded(eng, chunks, Bk)
                _restore(eng, snap)
            eng.backend.rows(eng.model.bufs["logits"], Bk).fill_bytes(0xFF, stream=eng.backend._s)
            outs[tag] = eng.backend.to_host(eng.graphs.run(chunks, Bk))
            _restore(eng, snap)
        finally:
            release()
    assert np.isfinite(outs["on"]).all()
    assert np.array_equal(outs["on"].view(np.uint32), eager.view(np.uint32)), "graph replay != eager (same step)"
    rel = float(np.abs(outs["on"] - outs["off"]).max() / np.abs(outs["off"]).max())
    record("engine", case=f"{name} fp8 gemv_w8a16 vs W8A8 decode n={n} bucket={Bk}", rel_max=rel)
    assert rel < _tols(name)[0]
