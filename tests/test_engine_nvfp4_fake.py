"""VkcBackend on an NVFP4 checkpoint without a driver (the fakes of tests/test_engine_vkc_backend_fake.py and
tests/test_engine_graphs_fake.py): every NVFP4 linear is packed into the MMA layout at load (ops.nvfp4.pack) and
every NVFP4 linear of every step -- eager prefill and decode, the graph runner's warm-up, captures and replays --
passes the real host validation of ops.nvfp4.linear_nvfp4 (the tensor-core kernel; above MMA_MAX_M rows the
dequantize + bf16 GEMM path), launches checked against the sm_90a manifest, on the backend's stream, with no
allocation inside a capture; the bf16 GEMM runs only the bf16 linears."""
from __future__ import annotations

import numpy as np
import pytest

from tests.engine_fixtures import HEADS_35B, MOE_SMALL, make_checkpoint
from tests.ops_fakes import declared_bases, patch_ops
from tests.test_engine_fp8_fake import Fp8StreamBackend
from tests.test_engine_graphs_fake import STREAM, _record_streams
from tests.test_engine_vkc_backend_fake import FakeDeviceBackend, _Rec, fake_vkc  # noqa: F401  (fixture)

pytest.importorskip("transformers")

from vkc_engine import LLM, SamplingParams  # noqa: E402
from vkc_engine.backend import GEMV_MAX_M, Nvfp4Weight  # noqa: E402
from vkc_engine.loader import RawTensor  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("nvfp4fake")
    make_checkpoint(d, heads=HEADS_35B, seed=7, nvfp4={})
    return d


@pytest.fixture()
def launches(fake_vkc, monkeypatch):  # noqa: F811
    from vkc_runtime.ops import gemm, gemv, nvfp4
    for m in (gemv, gemm, nvfp4):
        r = _Rec(declared=declared_bases(m))
        patch_ops(monkeypatch, m, "get_kernel", r)
        patch_ops(monkeypatch, m, "_sm_count", lambda dev: 132)
        fake_vkc[m.__name__.split(".")[-1]] = r
    patch_ops(monkeypatch, gemm, "has_kernel", fake_vkc["gemm"].has)
    seen = []
    for rec in fake_vkc.values():
        _record_streams(rec, seen)
    return seen


def test_nvfp4_linears_through_the_real_validation(launches, fake_vkc, ckpt, monkeypatch):  # noqa: F811
    be = Fp8StreamBackend(monkeypatch)
    llm = LLM(ckpt, backend=be, max_num_seqs=5, max_num_batched_tokens=40, max_model_len=256, num_blocks=32,
              block_size=64)
    assert llm.graphs is not None and be.captures == 4
    attn = llm.model.layers[1].mixer
    assert isinstance(attn.qkv, Nvfp4Weight) and isinstance(attn.o, Nvfp4Weight)
    n_setup = len(launches)
    outs = llm.generate([[5] * 70, [7] * 3, [9], [11] * 30], SamplingParams(temperature=0, max_tokens=4,
                                                                            ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs) and be.replays > 0 and len(launches) > n_setup
    assert not [(b, s) for b, s in launches if s != STREAM]
    assert not be.allocs_in_capture, be.allocs_in_capture[:5]
    bases = [b for b, _ in launches]
    assert "gemv.nvfp4_mma_pack" in bases[:n_setup]
    mma = [b for b in bases[n_setup:] if b.startswith("gemv.w4a16.mma.")]
    assert {b.split(".")[3] for b in mma} == {"m8", "m16"}  # decode rows (eager and captured), prefill chunks
    cfg = llm.cfg
    assert {n for _, n, _ in be.gemm.calls} <= {cfg.vocab_size, 2 * cfg.gdn_v_heads}  # lm_head, in_proj_b | a
    assert GEMV_MAX_M == 16
    # in_proj_b | a are bf16 beside the NVFP4 qkv | z: decode steps of <= BA_IN_STEP_MAX_ROWS rows compute them in
    # the recurrent step, larger ones (the capture of bucket 5) run the GEMV and the plain step
    from vkc_engine.model import BA_IN_STEP_MAX_ROWS
    assert llm.graphs.buckets == (1, 2, 4, 5) and BA_IN_STEP_MAX_ROWS == 4
    rows = {c[0]: set() for c in fake_vkc["gdn_decode"].calls}
    for c in fake_vkc["gdn_decode"].calls:
        rows[c[0]].add(c[1][0] // (cfg.gdn_v_heads * 8))  # grid (B * Hv * 128 / BLOCK_V): B at BLOCK_V 16
    assert {b.endswith(".ba") for b in rows} == {True, False}, rows
    assert all(max(r) <= 4 for b, r in rows.items() if b.endswith(".ba")), rows
    assert llm.model.layers[0].mixer.ba is not None


def test_weight_nvfp4_packs_into_the_mma_layout(launches, fake_vkc):  # noqa: F811
    from vkc_runtime.ops import nvfp4
    be = FakeDeviceBackend()
    be.synchronize = lambda: None  # no stream here: the packer's launch is recorded, not run
    K = 48  # packed rows of 24 bytes, scale rows of 3 (any row stride: the packer reads bytes)
    p = RawTensor("w", "U8", np.zeros((8, K // 2), np.uint8), "f")
    s = RawTensor("s", "F8_E4M3", np.full((8, K // 16), 0x38, np.uint8), "f")
    w = be.weight_nvfp4([p, p], [s, s], 0.25)
    assert w.shape == (16, K) and w.alpha == 0.25
    assert (w.mma.words.shape, w.mma.scales.shape) == nvfp4.mma_shapes(16, K)
    assert [b for b, _ in launches] == ["gemv.nvfp4_mma_pack"]
    with pytest.raises(Exception, match="weight_nvfp4 takes U8 codes"):
        be.weight_nvfp4([s], [s], 1.0)
    bad = RawTensor("model.x.weight_scale", "F8_E4M3", np.full((8, K // 16), 0x7F, np.uint8), "f.safetensors")
    with pytest.raises(Exception, match="model.x.weight_scale .* NaN"):
        be.weight_nvfp4([p], [bad], 1.0)


def test_large_prefill_chunks_dequantize_once_then_run_the_bf16_gemm(launches, ckpt, monkeypatch):
    """Chunks of more than ops.nvfp4.MMA_MAX_M rows: each NVFP4 linear dequantizes into the backend's one workspace
    (sized at prepare for the largest NVFP4 linear) and runs the bf16 GEMM (here its Triton lane)."""
    from vkc_runtime.ops import gemm
    monkeypatch.setattr(gemm, "has_cute", lambda: False)
    be = Fp8StreamBackend(monkeypatch)
    llm = LLM(ckpt, backend=be, max_num_seqs=2, max_num_batched_tokens=160, max_model_len=256, num_blocks=16,
              block_size=64, enforce_eager=True)
    big = max(w.shape[0] * w.shape[1] for w in _nvfp4_weights(llm.model))
    assert be._nvfp4_ws is not None and be._nvfp4_ws.shape == (big,)
    n0 = len(launches)
    llm.generate([[5] * 200], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    bases = [b for b, _ in launches[n0:]]
    assert "gemv.nvfp4_mma_dequant" in bases and any(b.startswith("gemm.bf16.mma.") for b in bases)
    assert not [(b, s) for b, s in launches if s != STREAM]


def _nvfp4_weights(model):
    from vkc_engine.model import _Segments
    for layer in model.layers:
        for blk in (layer.mixer, layer.mlp):
            for w in vars(blk).values():
                for x in (w.segs if isinstance(w, _Segments) else [(w,)]):
                    if isinstance(x[0], Nvfp4Weight):
                        yield x[0]


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("nvfp4moefake")
    make_checkpoint(d, heads=HEADS_35B, layer_types=["linear_attention", "full_attention"], moe=MOE_SMALL,
                    expert_layout="per_expert", seed=9, nvfp4={})
    return d


def quantized_moe_engine(launches, ckpt, monkeypatch, prefix: str, grouped: str | None = None, tokens: int = 40):
    """An LLM on a MoE checkpoint whose experts stay quantized, every MoE block of every step -- eager prefill chunks
    (of ``tokens``) on the grouped path, captured and replayed decode steps on the decode path -- through the real
    host validation of ops.moe.sparse_moe_block (kernels recorded against the sm_90a manifest): only the
    ``moe.<prefix>.*`` expert kernels launch (``moe.<grouped>.grouped.*`` on the grouped path where given), on the
    backend's stream, with no allocation inside a capture. Returns the LLM."""
    from vkc_runtime.ops import moe
    r = _Rec(declared=declared_bases(moe))
    patch_ops(monkeypatch, moe, "get_kernel", r)
    patch_ops(monkeypatch, moe, "has_kernel", r.has)
    patch_ops(monkeypatch, moe, "_sm_count", lambda dev: 132)
    _record_streams(r, launches)
    be = Fp8StreamBackend(monkeypatch)
    llm = LLM(ckpt, backend=be, max_num_seqs=4, max_num_batched_tokens=tokens, max_model_len=256, num_blocks=32,
              block_size=64)
    n0 = len(launches)
    outs = llm.generate([[5] * (tokens + 10), [7] * 3, [9]], SamplingParams(temperature=0, max_tokens=3,
                                                                            ignore_eos=True))
    assert all(len(o.token_ids) == 3 for o in outs) and be.replays > 0
    bases = [b for b, _ in launches[n0:] if b.startswith("moe.")]
    decode = (f"moe.{prefix}.gate_up.", f"moe.{prefix}.down.") if prefix.endswith(".mma") else (f"moe.{prefix}.decode.",)
    assert any(b.startswith(decode) for b in bases)
    assert any(b.startswith(f"moe.{grouped or prefix}.grouped.") for b in bases)
    assert not [b for b in bases if b.startswith(("moe.decode.", "moe.grouped."))]
    assert not [(b, s) for b, s in launches if s != STREAM]
    assert not be.allocs_in_capture, be.allocs_in_capture[:5]
    return llm


def test_nvfp4_experts_through_the_real_moe_validation(launches, fake_vkc, moe_ckpt, monkeypatch):  # noqa: F811
    """NVFP4 experts stay 4-bit, packed at load into the MMA layout (backend.experts_nvfp4 -> ops.moe.pack_experts
    -> Nvfp4MmaExperts), and run the tensor-core W4A16 expert kernels on both paths (quantized_moe_engine)."""
    from vkc_runtime.ops import moe
    llm = quantized_moe_engine(launches, moe_ckpt, monkeypatch, "w4a16.mma")
    E, H, I = llm.cfg.num_experts, llm.cfg.hidden_size, llm.cfg.moe_intermediate_size
    mlp = llm.model.layers[0].mlp
    assert isinstance(mlp.w1, moe.Nvfp4MmaExperts) and isinstance(mlp.w2, moe.Nvfp4MmaExperts)
    assert tuple(mlp.w1.words.shape) == moe.nvfp4_mma_shapes(E + 1, 2 * I, H)[0] and mlp.w1.alpha.shape == (E + 1, 2)
    assert tuple(mlp.w2.scales.shape) == moe.nvfp4_mma_shapes(E + 1, H, I)[1] and mlp.w2.alpha.shape == (E + 1, 1)
    assert (mlp.w1.rows, mlp.w1.k, mlp.w2.rows, mlp.w2.k) == (2 * I, H, H, I)
