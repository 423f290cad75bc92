"""VkcBackend on an FP8 checkpoint without a driver (the fakes of tests/test_engine_vkc_backend_fake.py and
tests/test_engine_graphs_fake.py): every FP8 linear of every step -- eager prefill and mixed steps, the graph
runner's warm-up, captures and replays -- passes ops.gemm_fp8's real host validation (quantize_fp8_per_token_group
into the backend's prepared buffers, then linear_fp8_block, launches checked against the sm_90a manifest), on the
backend's stream, with no allocation inside a capture; FP8 linears never take ops.gemv or the bf16 GEMM; an arch
without the FP8 kernels is refused at load."""
from __future__ import annotations

import pytest

from tests.engine_fixtures import HEADS_35B, make_checkpoint
from tests.ops_fakes import declared_bases, patch_ops
from tests.test_engine_graphs_fake import STREAM, StreamBackend, _record_streams
from tests.test_engine_vkc_backend_fake import _Rec, fake_vkc  # noqa: F401  (fixture)

pytest.importorskip("transformers")

from vkc_engine import LLM, SamplingParams  # noqa: E402
from vkc_engine.backend import BackendError  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("fp8fake")
    make_checkpoint(d, heads=HEADS_35B, seed=7, fp8={})  # 2 Hv % 8 == 0: FP8 segments
    return d


@pytest.fixture()
def fp8_launches(fake_vkc, monkeypatch):  # noqa: F811
    from vkc_runtime.ops import gemm_fp8, gemv
    for m in (gemv, gemm_fp8):
        r = _Rec(declared=declared_bases(m))
        patch_ops(monkeypatch, m, "get_kernel", r)
        patch_ops(monkeypatch, m, "_sm_count", lambda dev: 132)
        fake_vkc[m.__name__.split(".")[-1]] = r
    patch_ops(monkeypatch, gemm_fp8, "has_kernel", fake_vkc["gemm_fp8"].has)
    # the Triton block kernels (recorded launches; the sm_90a CuTe lane is one C call, run by the GPU engine tests)
    monkeypatch.setattr(gemm_fp8, "_cute_block_available", lambda: False)
    seen = []
    for rec in fake_vkc.values():
        _record_streams(rec, seen)
    return seen


class Fp8StreamBackend(StreamBackend):
    """StreamBackend counting device allocations made while a capture runs; its bf16 GEMM stand-in checks
    operands with ops.gemm's layout rule (row strides multiples of 8 and >= the row, 16-byte aligned pointers:
    the bf16 segments of a fused projection write column views of its output)."""

    def __init__(self, monkeypatch):
        super().__init__()
        from vkc_runtime.ops import gemm
        from vkc_runtime.ops._check import tensor

        def linear(x, weight, out=None, *, stream=None):
            assert stream == STREAM
            xt = tensor("linear", "x", x, "bfloat16", ndim=2)
            wt = tensor("linear", "weight", weight, "bfloat16", ndim=2, shape=(None, xt.shape[1]))
            ot = tensor("linear", "out", out, "bfloat16", ndim=2, shape=(xt.shape[0], wt.shape[0]))
            for name, t, cols in (("x", xt, "K"), ("weight", wt, "K"), ("out", ot, "N")):
                gemm._check_layout("linear", name, t, cols)
            self.gemm.calls.append((xt.shape[0], wt.shape[0], xt.shape[1]))
            return out
        self.gemm.linear = linear
        from vkc_runtime import memory
        self.allocs_in_capture = []
        empty = memory.DeviceArray.empty.__func__

        def counted(cls, shape, dtype="float32", **kw):
            if self._capturing:
                self.allocs_in_capture.append((shape, dtype))
            return empty(cls, shape, dtype, **kw)
        monkeypatch.setattr(memory.DeviceArray, "empty", classmethod(counted))


def test_fp8_linears_through_the_real_gemm_fp8_validation(fp8_launches, ckpt, monkeypatch):
    be = Fp8StreamBackend(monkeypatch)
    llm = LLM(ckpt, backend=be, max_num_seqs=5, max_num_batched_tokens=40, max_model_len=256, num_blocks=32,
              block_size=64)
    assert llm.graphs is not None and be.captures == 4
    cfg = llm.cfg
    H, I = cfg.hidden_size, cfg.intermediate_size
    assert be._fp8_buf[2:] == (40, max(H, cfg.num_q_heads * cfg.head_dim, cfg.gdn_value_dim, I))
    n_setup = len(fp8_launches)
    outs = llm.generate([[5] * 70, [7] * 3, [9], [11] * 30], SamplingParams(temperature=0, max_tokens=4,
                                                                            ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs) and be.replays > 0 and len(fp8_launches) > n_setup
    assert not [(b, s) for b, s in fp8_launches if s != STREAM]
    assert not be.allocs_in_capture, be.allocs_in_capture[:5]
    fp8 = [b for b, _ in fp8_launches if b.startswith("gemm_fp8.")]
    assert {b.split(".")[1] for b in fp8} == {"quant_group", "block"}
    assert fp8.count("gemm_fp8.quant_group") == len([b for b in fp8 if b.startswith("gemm_fp8.block.")])
    # bf16 linears only on the bf16 paths: the LM head and GDN in_proj_b | in_proj_a (N = 2 Hv)
    bf16_n = {cfg.vocab_size, 2 * cfg.gdn_v_heads}
    assert {n for _, n, _ in be.gemm.calls} <= bf16_n
    gemv_bases = [b for b, _ in fp8_launches if b.startswith("gemv.")]
    assert gemv_bases, "captured decode steps take ops.gemv for the bf16 linears"


def test_arch_without_fp8_kernels_is_refused(fp8_launches, ckpt, monkeypatch):
    from vkc_runtime.ops import gemm_fp8
    patch_ops(monkeypatch, gemm_fp8, "has_kernel", lambda base, device=None: False)
    with pytest.raises(BackendError, match="this device's arch has no FP8 kernels .*sm_89, sm_90a"):
        LLM(ckpt, backend=StreamBackend(), max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64,
            num_blocks=4, block_size=64)


def test_fp8_gemv_in_captured_steps_when_on(fp8_launches, ckpt, monkeypatch):
    """FP8_GEMV on: the captured decode steps' FP8 linears of M <= FP8_GEMV_MAX_M (1) rows take gemv_w8a16 through
    its real validation (the e4m3 bytes and block scales of the Fp8Weight, column views of a fused output), their
    split-K workspace sized by the warm-up (no allocation inside a capture); eager and prefill steps and captured
    steps of more rows keep quantize + linear_fp8_block."""
    from vkc_engine import backend as B
    monkeypatch.setattr(B, "FP8_GEMV", True)
    assert B.FP8_GEMV_MAX_M == 1
    be = Fp8StreamBackend(monkeypatch)
    llm = LLM(ckpt, backend=be, max_num_seqs=5, max_num_batched_tokens=40, max_model_len=256, num_blocks=32,
              block_size=64)
    assert be.captures == 4
    n_setup = len(fp8_launches)
    outs = llm.generate([[5] * 70, [7] * 3, [9]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert all(len(o.token_ids) == 4 for o in outs) and be.replays > 0
    assert not be.allocs_in_capture, be.allocs_in_capture[:5]
    bases = [b for b, _ in fp8_launches]
    w8 = [b for b in bases if b.startswith("gemv.w8a16.")]
    assert w8 and all(b.startswith("gemv.w8a16.m1.") for b in w8)  # the one-row bucket's CUDA-core kernel
    assert any(b.startswith("gemm_fp8.block.") for b in bases[n_setup:])  # prefill still on the W8A8 GEMM
    assert not [(b, s) for b, s in fp8_launches if s != STREAM]


@pytest.fixture(scope="module")
def moe_ckpt(tmp_path_factory):
    from tests.engine_fixtures import MOE_SMALL
    d = tmp_path_factory.mktemp("fp8moefake")
    make_checkpoint(d, heads=HEADS_35B, layer_types=["linear_attention", "full_attention"], moe=MOE_SMALL,
                    expert_layout="per_expert", seed=9, fp8={})
    return d


def test_fp8_experts_through_the_real_moe_validation(fp8_launches, fake_vkc, moe_ckpt, monkeypatch):  # noqa: F811
    """Per-expert FP8 experts stay FP8 (backend.experts_fp8 -> ops.moe.Fp8Experts) and run the W8A16 expert kernels
    on both paths with the W8A8 grouped rule switched off (ops.moe.W8A8_GROUPED; tests/test_engine_nvfp4_fake.py
    quantized_moe_engine)."""
    from tests.test_engine_nvfp4_fake import quantized_moe_engine
    from vkc_runtime.ops import moe
    from vkc_runtime.ops.moe import block
    monkeypatch.setattr(block, "W8A8_GROUPED", False)
    llm = quantized_moe_engine(fp8_launches, moe_ckpt, monkeypatch, "w8a16")
    E, H, I = llm.cfg.num_experts, llm.cfg.hidden_size, llm.cfg.moe_intermediate_size
    mlp = llm.model.layers[0].mlp
    assert isinstance(mlp.w1, moe.Fp8Experts) and isinstance(mlp.w2, moe.Fp8Experts)
    assert mlp.w1.q.shape == (E + 1, 2 * I, H) and mlp.w1.scale.shape == (E + 1, 2 * I // 128, -(-H // 128))
    assert mlp.w2.scale.shape == (E + 1, -(-H // 128), -(-I // 128))


def test_fp8_experts_w8a8_prefill(fp8_launches, fake_vkc, moe_ckpt, monkeypatch):  # noqa: F811
    """A 64-token prefill chunk of the small MoE (k' = 3 over E' = 9: block_m 64) runs the W8A8 grouped GEMMs (the
    engine makes its MoE workspace with w8a8=True for FP8 experts), the activations quantized by gemm_fp8's group
    quantizer on the same stream; decode-path steps stay W8A16 (the GEMVs), no grouped launch is W8A16."""
    from tests.test_engine_nvfp4_fake import quantized_moe_engine
    from vkc_runtime.ops import moe
    n0 = len(fp8_launches)
    llm = quantized_moe_engine(fp8_launches, moe_ckpt, monkeypatch, "w8a16", grouped="w8a8", tokens=64)
    assert moe.fp8_mode("fp8", moe.W8A8_BLOCK_M, llm.backend._moe_ws) != "w8a16"
    bases = [b for b, _ in fp8_launches[n0:]]
    assert not [b for b in bases if b.startswith("moe.w8a16.grouped.")]  # W8A8 at every grouped M
    assert bases.count("gemm_fp8.quant_group") >= 2 * len(llm.model.layers)  # x and h, per layer of the chunk
