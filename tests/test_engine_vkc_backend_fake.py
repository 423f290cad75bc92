"""vkc_engine's real backend (vkc_engine.backend.VkcBackend) driven without a driver: device memory is fake
(pointers only), every kernel lookup goes to a recorder that checks each launch's argument list against the
committed sm_90a manifest (tests/ops_fakes.py), and a stand-in for the BF16 GEMM checks its operands. So every
op call the engine makes -- prefill, decode and mixed steps, chunked prefill -- passes the real ops' host
validation (dtypes, shapes, strides, alignment, workspaces) and picks declared kernels; only the numbers are
not computed (tests/gpu/test_gpu_engine.py checks those on the H200)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from tests.engine_fixtures import HEADS_27B, HEADS_35B, MOE_SMALL, make_checkpoint
from tests.ops_fakes import Recorder, declared_bases, patch_ops

pytest.importorskip("transformers")

from vkc_engine import LLM, SamplingParams  # noqa: E402
from vkc_engine.backend import BackendError, VkcBackend  # noqa: E402


class _FakeGemm:
    """Stands in for vkc_runtime.ops.gemm: linear(x [M, K], weight [N, K], out [M, N]), all bf16, checked with
    the ops' own validation helper."""

    def __init__(self):
        self.calls = []

    def linear(self, x, weight, out=None, *, stream=None):
        from vkc_runtime.ops._check import tensor
        xt = tensor("linear", "x", x, "bfloat16", ndim=2)
        M, K = xt.shape
        wt = tensor("linear", "weight", weight, "bfloat16", ndim=2, shape=(None, K))
        assert wt.is_contiguous()
        ot = tensor("linear", "out", out, "bfloat16", ndim=2, shape=(M, wt.shape[0]))
        assert ot.is_contiguous() or M == 1
        self.calls.append((M, wt.shape[0], K))
        return out


class _FakeMoe:
    """Stands in for vkc_runtime.ops.moe (sparse_moe_block + moe_workspace): checks every operand against the
    agreed layout (w1 [E + 1, 2I, H], w2 [E + 1, H, I] with the shared expert as expert E, shared_gate_w [1, H],
    renormalize on, the step within the workspace's max_tokens)."""

    def __init__(self):
        self.calls, self.workspaces = [], []

    def moe_workspace(self, max_tokens, num_experts, top_k, hidden, intermediate, *, shared, w8a8=False,
                      device=None):
        ws = dict(max_tokens=max_tokens, E=num_experts, k=top_k, H=hidden, I=intermediate, shared=shared, w8a8=w8a8)
        self.workspaces.append(ws)
        return ws

    def sparse_moe_block(self, x, gate_w, w1, w2, top_k, *, renormalize, shared_gate_w=None, workspace, out,
                         stream=None):
        from vkc_runtime.ops._check import tensor
        ws = workspace
        E, H, I = ws["E"], ws["H"], ws["I"]
        xt = tensor("moe", "x", x, "bfloat16", ndim=2, shape=(None, H))
        M = xt.shape[0]
        assert xt.is_contiguous() and 0 < M <= ws["max_tokens"] and top_k == ws["k"] and renormalize is True
        tensor("moe", "gate_w", gate_w, "bfloat16", shape=(E, H))
        assert tensor("moe", "w1", w1, "bfloat16", shape=(E + 1, 2 * I, H)).is_contiguous()
        assert tensor("moe", "w2", w2, "bfloat16", shape=(E + 1, H, I)).is_contiguous()
        assert ws["shared"] and shared_gate_w is not None
        tensor("moe", "shared_gate_w", shared_gate_w, "bfloat16", shape=(1, H))
        assert tensor("moe", "out", out, "bfloat16", shape=(M, H)).is_contiguous()
        self.calls.append(M)
        return out


class _Rec(Recorder):
    """The ops_fakes recorder plus what workspaces ask of a kernel (load, scratch size)."""

    def __call__(self, base, device=None):
        k = super().__call__(base)
        k.load = lambda: None
        k.scratch_bytes = lambda grid: 4096
        return k


@pytest.fixture()
def fake_vkc(monkeypatch):
    from vkc_runtime import memory
    from vkc_runtime.ops import act, attn, conv, embedding, gdn, gdn_decode, norm, rope, sample
    nxt = [1 << 36]

    def fake_alloc(cls, shape, dtype="float32", *, device=None, stream=None):
        a = cls(shape, dtype, ptr=nxt[0], device=0)
        nxt[0] += (a.nbytes + 4095) // 4096 * 4096 + 4096
        return a

    monkeypatch.setattr(memory.DeviceArray, "empty", classmethod(fake_alloc))
    monkeypatch.setattr(memory.DeviceArray, "zeros", classmethod(fake_alloc))
    recs = {}
    for m in (act, attn, conv, embedding, gdn, gdn_decode, norm, rope, sample):
        recs[m.__name__.split(".")[-1]] = r = _Rec(declared=declared_bases(m))
        patch_ops(monkeypatch, m, "get_kernel", r)
    patch_ops(monkeypatch, attn, "has_kernel", lambda base, device=None: recs["attn"].has(base))
    patch_ops(monkeypatch, attn, "_sm_count", lambda dev: 132)
    return recs


class _FakeCu:
    """Driver function names as themselves (the backend passes them to ``_FakeDrv.call``)."""
    CUevent_flags = SimpleNamespace(CU_EVENT_DISABLE_TIMING=2, CU_EVENT_DEFAULT=0)

    def __getattr__(self, name):
        return name


class _FakeDrv:
    """The driver calls the backend makes itself (pinned host memory, events, async copies), recorded. Pinned
    memory is real host memory (zeros: the draws read back as token 0); device copies are only recorded."""

    def __init__(self):
        self.cu, self.calls, self._keep = _FakeCu(), [], {}

    def call(self, fn, *args, detail=None):
        self.calls.append((fn, args))
        if fn == "cuMemHostAlloc":
            buf = np.zeros(int(args[0]), np.uint8)
            self._keep[buf.ctypes.data] = buf
            return buf.ctypes.data
        return 7 if fn == "cuEventCreate" else None


class FakeDeviceBackend(VkcBackend):
    """VkcBackend with host<->device copies skipped (fake memory): every op call is the real one."""
    supports_graphs = False  # eager steps here (tests/test_engine_graphs_fake.py drives the graph path)

    def __init__(self, moe=None):
        self.gemm = _FakeGemm()
        self._bind_modules(gemm=self.gemm, moe=moe)
        self._drv = _FakeDrv()
        self.device = 0
        self._gdn_ws = self._pws = self._dws = self._moe_ws = None
        self.uploads = []

    def free_memory(self):
        return 1 << 34, 1 << 34

    def weight(self, parts, dtype, shape=None):
        rows = sum(p.shape[0] for p in parts)
        assert all(p.shape[1:] == parts[0].shape[1:] for p in parts)
        out = self.empty((rows,) + tuple(parts[0].shape[1:]), dtype)
        return out if shape is None else out.reshape(*shape)

    def upload_into(self, dst, host):
        host = np.ascontiguousarray(host)
        assert host.dtype in (np.int32, np.int64, np.float32) and host.size <= dst.size
        self.uploads.append(host.copy())
        return self.rows(dst, host.size).reshape(*host.shape)

    def to_host(self, x):
        return np.zeros(x.shape, np.float32)

    def zero_slots(self, pool, slots):
        assert all(0 <= s < pool.shape[0] for s in slots)

    def warm_gemm_plans(self, nks, max_m):  # no driver: no plans (tests/test_engine_plans.py drives the real one)
        return None


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    d = tmp_path_factory.mktemp("fakeck")
    make_checkpoint(d, heads=HEADS_27B, seed=4)
    return d


def test_every_op_call_passes_the_real_validation(fake_vkc, ckpt):
    be = FakeDeviceBackend()
    llm = LLM(ckpt, backend=be, max_num_seqs=4, max_num_batched_tokens=40, max_model_len=256, num_blocks=32,
              block_size=64)
    sp = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    outs = llm.generate([[5] * 70, [7] * 3, [9], [11] * 30], sp)  # chunked (70 > 40), mixed and decode steps
    assert all(len(o.token_ids) == 3 for o in outs)
    names = {k: {c[0] for c in r.calls} for k, r in fake_vkc.items()}
    assert "attn.prefill.d256.gate.tma" in names["attn"]  # block 64 on sm_90a: the TMA kernel
    assert any(n.startswith("attn.decode") for n in names["attn"])
    assert any(n.startswith("attn.cache_write") or "cache" in n for n in names["attn"])
    assert {n.split(".")[1] for n in names["conv"]} == {"prefill", "heads", "update"}
    assert {n.split(".")[1] for n in names["gdn"]} == {"chunk_index", "prep", "kkt_wy", "delta_h", "chunk_o"}
    assert names["gdn_decode"]
    assert {n.split(".")[1] for n in names["sample"]} == {"row", "stats"}  # the device sampler, every step
    assert {n.split(".")[1] for n in names["norm"]} == {"rmsnorm", "add_rmsnorm", "gated_rmsnorm"}
    assert {n.split(".")[1] for n in names["embedding"]} == {"embedding"}
    assert {n.split(".")[1] for n in names["rope"]} == {"qk_norm_rope"}
    assert {n.split(".")[1] for n in names["act"]} == {"silu_mul"}
    cfg = llm.cfg
    H, V = cfg.hidden_size, cfg.vocab_size
    Ns = {n for _, n, _ in be.gemm.calls}
    assert {V, H, 2 * cfg.intermediate_size, cfg.gdn_qkv_dim + cfg.gdn_value_dim + 2 * cfg.gdn_v_heads,
            cfg.num_q_heads * 2 * cfg.head_dim + 2 * cfg.num_kv_heads * cfg.head_dim} <= Ns
    assert llm.scheduler.blocks.num_free == 32
    # overlapped steps: decode rows fed from the previous step's draws by device copies of whole int32 runs
    d2d = [a for f, a in be._drv.calls if f == "cuMemcpyDtoDAsync"]
    assert llm.num_ahead_steps > 0 and len(d2d) >= llm.num_ahead_steps and all(a[2] % 4 == 0 for a in d2d)


def test_pending_draws_and_copy_rows_refuse_misuse(fake_vkc, ckpt):
    be = FakeDeviceBackend()
    llm = LLM(ckpt, backend=be, max_num_seqs=2, max_num_batched_tokens=16, max_model_len=64, num_blocks=4,
              block_size=64)
    logits = be.rows(llm.model.bufs["logits"], 2)
    sp = [SamplingParams(temperature=0)] * 2
    p1, p2 = be.sample_async(logits, sp, [None] * 2), be.sample_async(logits, sp, [None] * 2)
    assert p2.result().tokens.shape == (2,)  # two steps' draws may be pending at once
    p3 = be.sample_async(logits, sp, [None] * 2)
    with pytest.raises(RuntimeError, match="reused"):  # the third draw reused the first one's landing memory
        p1.result()
    ids = be.empty((8,), "i32")
    be.copy_rows(ids, 6, p3.tokens, 0, 2)
    for bad in ((ids, 7, p3.tokens, 0, 2), (ids, 0, p3.tokens, 1, 2), (ids, 0, logits, 0, 1)):
        with pytest.raises(BackendError):
            be.copy_rows(*bad)


def test_teacher_forced_path_validates(fake_vkc, ckpt):
    be = FakeDeviceBackend()
    llm = LLM(ckpt, backend=be, max_num_seqs=2, max_num_batched_tokens=64, max_model_len=512, num_blocks=16,
              block_size=64)
    got = llm.prompt_logits(list(range(1, 150)), chunk=50)
    assert got.shape == (149, llm.cfg.vocab_size)
    rows = [u for u in be.uploads if u.ndim == 1 and len(u) == 50 and u[0] == 0 and u[-1] == 49]
    assert rows  # 'all' logit rows of a chunk: 0 .. 49


def test_moe_model_calls_the_moe_block_per_contract(fake_vkc, tmp_path):
    make_checkpoint(tmp_path, heads=HEADS_35B, layer_types=["linear_attention", "full_attention"], moe=MOE_SMALL,
                    expert_layout="per_expert", vlm=True, seed=5)
    moe = _FakeMoe()
    be = FakeDeviceBackend(moe=moe)
    llm = LLM(tmp_path, backend=be, max_num_seqs=4, max_num_batched_tokens=40, max_model_len=256, num_blocks=32,
              block_size=64)
    assert moe.workspaces == [dict(max_tokens=40, E=8, k=2, H=256, I=128, shared=True, w8a8=False)]  # bf16 experts
    outs = llm.generate([[5] * 50, [7] * 3, [9]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert all(len(o.token_ids) == 3 for o in outs)
    # steps: the first 40-token chunk of the long prompt, its last 10 + the two short prompts, then decode
    assert moe.calls == [40] * 2 + [14] * 2 + [3] * 2 * 2  # one call per layer and step
    H = llm.cfg.hidden_size  # N == H: the mixers' out projections only (a dense MLP would add gate_up and down)
    assert sum(n == H for _, n, _ in be.gemm.calls) == len(moe.calls)


def test_moe_refusals(fake_vkc, tmp_path, monkeypatch):
    from vkc_engine.backend import BackendError
    from vkc_engine.config import load_config
    make_checkpoint(tmp_path, heads=HEADS_35B, layer_types=["full_attention"], moe=dict(
        MOE_SMALL, shared_expert_intermediate_size=256), expert_layout="fused", seed=6)
    cfg = load_config(tmp_path)
    with pytest.raises(BackendError, match="shared_expert_intermediate_size 256 != moe_intermediate_size 128"):
        FakeDeviceBackend(moe=_FakeMoe()).check_model(cfg)
    import builtins
    real_import = builtins.__import__

    def no_moe(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "vkc_runtime.ops" and fromlist and "moe" in fromlist:
            raise ImportError("No module named 'vkc_runtime.ops.moe'")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_moe)
    with pytest.raises(BackendError, match=r"vkc_runtime\.ops\.moe \(the MoE kernels"):
        FakeDeviceBackend().check_model(cfg)
    FakeDeviceBackend().check_model(_dense_cfg())  # a dense model needs no MoE ops


def _dense_cfg():
    from tests.test_engine_loader import BASE
    from vkc_engine.config import parse_config
    return parse_config({**BASE, "model_type": "qwen3_5"})


def test_moe_model_through_the_real_moe_ops(fake_vkc, tmp_path, monkeypatch):
    """With vkc_runtime.ops.moe (router + grouped GEMMs + the decode path) in the tree: every MoE call of the
    engine passes the real ops' host validation and launches declared kernels (small decode/mixed steps and a
    1000-token prefill, which takes the larger block_m tiles)."""
    moe = pytest.importorskip("vkc_runtime.ops.moe")
    if not getattr(moe, "GROUPED_BASES", ()):
        pytest.skip("vkc_runtime.ops.moe has no grouped GEMMs in this tree")
    rec = _Rec(declared=declared_bases(moe))
    patch_ops(monkeypatch, moe, "get_kernel", rec)
    patch_ops(monkeypatch, moe, "has_kernel", rec.has)
    patch_ops(monkeypatch, moe, "_sm_count", lambda dev: 132)
    make_checkpoint(tmp_path, heads=HEADS_35B, layer_types=["linear_attention", "full_attention"], moe=MOE_SMALL,
                    expert_layout="per_expert", vlm=True, seed=5)
    llm = LLM(tmp_path, backend=FakeDeviceBackend(moe=moe), max_num_seqs=4, max_num_batched_tokens=40,
              max_model_len=256, num_blocks=32, block_size=64)
    outs = llm.generate([[5] * 50, [7] * 3, [9]], SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    assert all(len(o.token_ids) == 3 for o in outs)
    small = {c[0] for c in rec.calls}
    big = LLM(tmp_path, backend=FakeDeviceBackend(moe=moe), max_num_seqs=2, max_num_batched_tokens=1024,
              max_model_len=1100, num_blocks=40, block_size=64)
    assert big.prompt_logits(list(range(1, 1001))).shape == (1000, big.cfg.vocab_size)
    names = {c[0] for c in rec.calls}
    # decode steps of <= 3 rows take the block's decode path (ops/moe/decode_ops.py), the prefills the grouped one
    assert {n.split(".")[1] for n in names} == {"route", "align", "grouped", "combine", "decode"}
    assert any(n.startswith("moe.decode.") for n in small)
    assert len({n for n in names if n.startswith("moe.grouped.")}) > len(
        {n for n in small if n.startswith("moe.grouped.")})  # the long prefill picks other tiles


def test_penalties_and_logprobs_pass_the_sampler_validation(fake_vkc, ckpt):
    be = FakeDeviceBackend()
    llm = LLM(ckpt, backend=be, max_num_seqs=2, max_num_batched_tokens=40, max_model_len=128, num_blocks=8,
              block_size=64)
    ps = [SamplingParams(temperature=0.7, max_tokens=3, ignore_eos=True, repetition_penalty=1.3, frequency_penalty=0.5,
                         logprobs=20),
          SamplingParams(temperature=0, max_tokens=3, ignore_eos=True, logprobs=0),
          SamplingParams(temperature=0, max_tokens=2, ignore_eos=True, presence_penalty=1.0)]
    outs = llm.generate([[5] * 9, [7] * 3, [3] * 4], ps)
    assert [len(o.logprobs or []) for o in outs] == [3, 3, 0] and len(outs[0].logprobs[0].top) <= 20
    names = [c[0] for c in fake_vkc["sample"].calls]
    assert names.count("sample.reset") == 2                       # one count row set up per penalized request
    assert names.count("sample.counts") == 2 + 3 + 2  # prompt bits per set-up + one add per step with a penalized row
    assert be._counts.shape == (2, llm.cfg.vocab_size)
