"""vkc_engine on NVFP4 checkpoints on the GPU (VkcBackend: W4A16 -- ops.gemv.gemv_w4a16 for M <= 16, else
ops.gemm.linear_w4a16), on tiny checkpoints with the real head configurations of tests/gpu/test_gpu_engine.py
quantized as llm-compressor / ModelOpt store NVFP4 (tests/engine_fixtures.py ``nvfp4=``: every projection except
lm_head, embeddings, the router, the shared-expert gate and GDN in_proj_a / in_proj_b; q / k / v, gate / up and
in_proj_qkv / in_proj_z share one global scale; MoE experts and the shared expert NVFP4, kept NVFP4 on the
device: ops.moe's W4A16 expert kernels):

- the expected linears are NVFP4 on the device (one run per shared scale, the bf16 segments beside them);
- teacher-forced logits vs HF transformers fp32 holding the exact dequantized weights, within the bf16 engine's
  tolerances of tests/gpu/test_gpu_engine.py (W4A16 multiplies bf16 activations with the exact weights, so the
  error budget is the bf16 one), recorded as family "engine";
- the same vs the numpy-backend engine (float64 W4A16);
- CUDA graph replay == the same padded step run eagerly, bit for bit (both take gemv_w4a16 at M <= 16);
- greedy continuations vs the numpy-backend engine with the divergence rule of tests/gpu/test_gpu_engine.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine_fixtures import make_checkpoint
from tests.gpu.errlog import record
from tests.gpu.test_gpu_engine import (LAYERS, MOE, REAL_HEADS, _check_greedy, _decode_batch, _eager_padded, _engine,
                                       _margin, _need_moe_ops, _prompt, _restore, _snapshot, _tols,
                                       check_teacher_forced)

pytestmark = pytest.mark.gpu
pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ml_dtypes")


@pytest.fixture(scope="module", params=["27b-ct", "27b-modelopt", "35b-a3b"])
def setup(request, tmp_path_factory):
    from vkc_runtime.ops import gemm
    if not hasattr(gemm, "linear_w4a16"):
        pytest.skip("vkc_runtime.ops.gemm.linear_w4a16 (an NVFP4 checkpoint's prefill GEMM) is not in this tree")
    tag = request.param
    d = tmp_path_factory.mktemp(f"engine_nvfp4_{tag}")
    if tag == "35b-a3b":
        _need_moe_ops()
        model, _ = make_checkpoint(d, heads=REAL_HEADS["35b"], layer_types=LAYERS, hidden=512, moe=MOE, seed=23,
                                   expert_layout="per_expert", vlm=True, nvfp4={"layout": "compressed-tensors"})
    else:
        layout = "modelopt" if tag.endswith("modelopt") else "compressed-tensors"
        model, _ = make_checkpoint(d, heads=REAL_HEADS["27b"], layer_types=LAYERS, hidden=512, intermediate=1024,
                                   seed=21, nvfp4={"layout": layout})
    name = "35b-a3b" if tag == "35b-a3b" else "27b"
    return name, d, model, _engine(d), tag


def _setup4(setup):
    return setup[:4]


@pytest.fixture(scope="module")
def numpy_engine(setup):
    from tests.engine_numpy_backend import NumpyBackend
    from vkc_engine import LLM
    d = setup[1]
    return LLM(d, backend=NumpyBackend(), max_num_seqs=2, max_num_batched_tokens=512, max_model_len=400,
               num_blocks=8, block_size=64)


def test_nvfp4_weights_on_the_device(setup):
    from vkc_engine.backend import Nvfp4Weight
    from vkc_engine.model import _Segments
    name, _, _, llm, _ = setup
    m = llm.model
    attn = m.layers[LAYERS.index("full_attention")].mixer
    gdn = m.layers[0].mixer
    assert isinstance(attn.qkv, Nvfp4Weight) and isinstance(attn.o, Nvfp4Weight)
    assert isinstance(gdn.in_proj, _Segments)
    assert [type(s[0]).__name__ for s in gdn.in_proj.segs] == ["Nvfp4Weight", "DeviceArray"]  # qkv | z, b | a
    assert isinstance(gdn.out, Nvfp4Weight) and not isinstance(m.lm_head, Nvfp4Weight)
    if name != "35b-a3b":
        assert isinstance(m.layers[0].mlp.gate_up, Nvfp4Weight) and isinstance(m.layers[0].mlp.down, Nvfp4Weight)
    else:
        from vkc_runtime.ops.moe import Nvfp4MmaExperts  # packed at load into the MMA layout (tensor-core decode)
        assert all(isinstance(layer.mlp.w1, Nvfp4MmaExperts) and isinstance(layer.mlp.w2, Nvfp4MmaExperts)
                   for layer in m.layers)


@pytest.mark.parametrize("n", [1, 17, 300, 2000])
def test_teacher_forced_logits_vs_hf(setup, n):
    check_teacher_forced(_setup4(setup), n, _tols(setup[0]), f"nvfp4 {setup[4]} teacher-forced")


@pytest.mark.parametrize("n", [17, 300])
def test_teacher_forced_logits_vs_numpy_engine(setup, numpy_engine, n):
    name, _, _, llm, tag = setup
    ids = _prompt(n, llm.cfg.vocab_size, 1300 + n)
    ref = numpy_engine.prompt_logits(ids)
    got = llm.prompt_logits(ids)
    d = got - ref
    rel = float(np.abs(d).max() / np.abs(ref).max())
    fro = float(np.linalg.norm(d) / np.linalg.norm(ref))
    record("engine", case=f"{tag} nvfp4 vs numpy W4A16 engine n={n}", rel_max=rel, rel_fro=fro)
    tol_max, tol_fro = _tols(name)
    assert rel < tol_max and fro < tol_fro


@pytest.mark.parametrize("n", [1, 5, 17])
def test_graph_replay_equals_eager(setup, n):
    from vkc_engine.graphs import bucket_for
    _, _, _, llm, tag = setup
    be, g = llm.backend, llm.graphs
    assert g is not None
    B = bucket_for(n, g.buckets)
    chunks, release = _decode_batch(llm, n, seed=170 + n)
    try:
        snap = _snapshot(llm)
        eager = _eager_padded(llm, chunks, B)
        _restore(llm, snap)
        be.rows(llm.model.bufs["logits"], B).fill_bytes(0xFF, stream=be._s)  # NaN: the replay must write it
        graph = be.to_host(g.run(chunks, B))
        _restore(llm, snap)
        assert np.isfinite(graph).all() and graph.shape == (n, llm.cfg.vocab_size)
        assert np.array_equal(graph.view(np.uint32), eager.view(np.uint32)), "graph replay != eager (same step)"
        record("engine", case=f"{tag} nvfp4 graph == eager decode n={n} bucket={B}", rel_max=0.0)
    finally:
        release()


def test_greedy_vs_numpy_engine(setup, numpy_engine):
    from vkc_engine import SamplingParams
    _, _, _, llm, tag = setup
    ids = _prompt(17, llm.cfg.vocab_size, 2017)
    sp = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    want = numpy_engine.generate(ids, sp)[0].token_ids
    got = llm.generate(ids, sp)[0].token_ids
    assert len(got) == len(want) == 32
    seq = ids + want
    noise = 2.0 * float(np.abs(llm.prompt_logits(seq) - numpy_engine.prompt_logits(seq)).max())
    _check_greedy(f"{tag} nvfp4 greedy32 vs numpy engine n=17", got, want,
                  lambda j: _margin(numpy_engine.prompt_logits(ids + want[:j])[-1]), noise)
