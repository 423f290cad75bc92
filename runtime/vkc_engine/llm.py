"""The user-facing engine: ``LLM(model_dir).generate(prompts, SamplingParams(...))``, and the step-level API a
server drives (``add_request`` / ``step`` / ``abort``; every step returns the requests that progressed, with
their new text).

One step: the scheduler picks (sequence, new tokens) pairs; their tokens, positions, KV slots, block tables
and GDN slots go to the device in preallocated buffers; the model runs once over the packed batch (the decode
kernels when every sequence brings one token, the varlen prefill kernels otherwise, which also carry decode
rows of a mixed step); the rows that end a sequence's known tokens are sampled.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .cache import BlockPool, CacheStorage, SlotPool, plan_cache
from .chat import load_chat_template, render_chat
from .config import load_config
from .detok import IncrementalDetokenizer
from .dummy import DummyCheckpoint
from .gemm_shapes import linear_shapes, plan_line
from .loader import Checkpoint
from .model import Qwen35Model, Step, host_step_arrays
from .sampler import Logprob, SamplingParams, row_logprob
from .scheduler import Scheduler, Sequence

__all__ = ["LLM", "SamplingParams", "RequestOutput", "Logprob"]


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    delta_text: str = ""
    delta_token_ids: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    logprobs: list[Logprob] | None = None        # per output token (aligned with token_ids) when asked for
    delta_logprobs: list[Logprob] | None = None  # those of delta_token_ids


def _load_tokenizer(model_dir: Path):
    p = model_dir / "tokenizer.json"
    if not p.is_file():
        return None
    from tokenizers import Tokenizer  # noqa: PLC0415
    return Tokenizer.from_file(str(p))


class LLM:
    """A Qwen3.5/3.6 model (dense or MoE) from an HF directory on a backend (default: vkc's kernels on the GPU).

    ``max_num_seqs``: sequences per step (and GDN state slots); ``max_num_batched_tokens``: the per-step token
    budget (chunked prefill); ``max_model_len``: longest prompt + output; ``block_size``: KV block tokens;
    ``memory_fraction``: share of the device's free memory (after weights) for the caches, or ``num_blocks``
    exactly. ``load_format="dummy"``: random weights of the config's shapes instead of the safetensors (speed
    runs; vkc_engine.dummy). ``progress(done, total)`` is called while weights load. ``enforce_eager``: no CUDA
    graphs (otherwise, on a backend that supports them, pure-decode steps replay graphs captured here:
    vkc_engine.graphs). A capture the driver rejects is logged and the engine runs eagerly, unless
    ``strict_graphs`` (then it raises; the tests use it). Before any step or capture the backend resolves the GEMM
    plans of every bf16 linear (``backend.warm_gemm_plans``; the VKC_PLAN_* settings of vkc_runtime.plans decide the
    mode and file): first of all for a bf16 checkpoint, right after the weights for an FP8 one (whose bf16 linears
    follow from its stored dtypes); ``plan_report`` is its report (logged as one line), None on a backend without
    plans. ``quantized_experts``: an FP8 / NVFP4 MoE checkpoint's experts stay quantized on the device (W8A16 /
    W4A16 in ops.moe: 2x / 3.5x less memory than bf16); False dequantizes them to bf16 at load (more memory; on
    the H200 the bf16 expert kernels are faster for long prefill chunks: BENCHMARKS.md, session 17).
    """

    def __init__(self, model_dir, *, backend=None, max_num_seqs: int = 32, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, block_size: int = 64, memory_fraction: float = 0.85,
                 num_blocks: int | None = None, load_format: str = "safetensors", progress=None, log=None,
                 enforce_eager: bool = False, strict_graphs: bool = False, quantized_experts: bool = True):
        t0 = time.perf_counter()
        self.model_dir = Path(model_dir)
        self.cfg = load_config(self.model_dir)
        if backend is None:
            from .backend import VkcBackend  # noqa: PLC0415
            backend = VkcBackend()
        self.backend = be = backend
        be.check_model(self.cfg)
        self.log = log or (lambda msg: None)
        self.max_model_len = int(max_model_len or min(self.cfg.max_position_embeddings, 32768))
        self.max_num_seqs = int(max_num_seqs)
        self.max_num_batched_tokens = int(max_num_batched_tokens)
        # GEMM plans of every linear at every step size, resolved before any capture or step (vkc_engine.gemm_shapes);
        # a bf16 checkpoint's set follows from its config, so it is resolved before any weight is read (a frozen miss
        # fails in seconds); an FP8 checkpoint's bf16 linears depend on its stored dtypes: resolved right after the
        # weights load. None: the backend has no plans
        self.plan_report = None
        if self.cfg.quant is None:
            self._warm_plans(linear_shapes(self.cfg))
        if load_format == "dummy":
            ckpt = DummyCheckpoint(self.model_dir)
        elif load_format == "safetensors":
            ckpt = Checkpoint(self.model_dir)
        else:
            raise ValueError(f"load_format must be 'safetensors' or 'dummy', got {load_format!r}")
        if ckpt.ignored_summary():
            self.log(ckpt.ignored_summary())
        self.model = Qwen35Model(self.cfg, ckpt, be, max_tokens=self.max_num_batched_tokens,
                                 max_seqs=self.max_num_seqs, progress=progress, log=self.log,
                                 quantized_experts=quantized_experts)
        if self.cfg.quant is not None:
            self._warm_plans(self.model.gemm_shapes)
        be.prepare(self.max_num_batched_tokens, self.max_num_seqs, self.cfg)
        if num_blocks is None:
            free, _ = be.free_memory()
            budget = int(free * memory_fraction)
        else:
            budget = 0
        self.plan = plan_cache(self.cfg, budget, block_size=block_size, max_num_seqs=self.max_num_seqs,
                               max_model_len=self.max_model_len, num_blocks=num_blocks)
        self.cache = CacheStorage(be, self.cfg, self.plan)
        self.log(self.plan.describe())
        self.max_blocks = -(-self.max_model_len // block_size)
        self.scheduler = Scheduler(BlockPool(self.plan.num_blocks, block_size), SlotPool(self.plan.num_slots),
                                   max_num_seqs=self.max_num_seqs, max_num_batched_tokens=self.max_num_batched_tokens)
        Tm, Bm = self.max_num_batched_tokens, self.max_num_seqs
        self._meta = {"ids": be.empty((Tm,), "i32"), "positions": be.empty((Tm,), "i32"),
                      "slot_mapping": be.empty((Tm,), "i32"), "cu_seqlens": be.empty((Bm + 1,), "i32"),
                      "seq_lens": be.empty((Bm,), "i32"), "block_tables": be.empty((Bm * self.max_blocks,), "i32"),
                      "gdn_slots": be.empty((Bm,), "i32"), "logit_rows": be.empty((Tm,), "i32")}
        self.tokenizer = _load_tokenizer(self.model_dir)
        self.chat_template = load_chat_template(self.model_dir)
        self.eos_ids = set(self.cfg.eos_token_ids)
        self._requests: dict[str, Sequence] = {}
        self._count_owner: dict[int, int] = {}  # penalty-count row (= state slot) -> seq_id it was set up for
        self.graphs = None
        if not enforce_eager and getattr(be, "supports_graphs", False):
            from .graphs import DecodeGraphs  # noqa: PLC0415
            try:
                self.graphs = DecodeGraphs(self, log=self.log)
            except RuntimeError as e:  # a capture the driver invalidated (vkc_runtime.CudaError): run eagerly
                self.log(f"CUDA graphs: capture failed ({e}); decode steps run eagerly")
                if strict_graphs:
                    raise
        self.load_seconds = time.perf_counter() - t0

    def _warm_plans(self, nks) -> None:
        """Resolve the GEMM plans of these (N, K) at every M up to the step budget (backend.warm_gemm_plans)."""
        self.plan_report = self.backend.warm_gemm_plans(nks, self.max_num_batched_tokens)
        if self.plan_report is not None:
            self.log(plan_line(self.plan_report))

    def close(self) -> None:
        """Release the CUDA graphs (the engine keeps running eagerly if used afterwards)."""
        g, self.graphs = self.graphs, None
        if g is not None:
            g.close()

    # ------------------------------------------------------------------------------------------ requests
    def encode(self, prompt: str) -> list[int]:
        if self.tokenizer is None:
            raise ValueError(f"{self.model_dir} has no tokenizer.json: pass token ids instead of text")
        return self.tokenizer.encode(prompt).ids

    def add_request(self, prompt, params: SamplingParams | None = None, request_id: str | None = None) -> str:
        """Queue a prompt (text or token ids); returns its request id."""
        params = params or SamplingParams()
        text = prompt if isinstance(prompt, str) else None
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if len(ids) >= self.max_model_len:
            raise ValueError(f"prompt of {len(ids)} tokens does not leave room for output within max_model_len "
                             f"{self.max_model_len}")
        if any(not 0 <= t < self.cfg.vocab_size for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {self.cfg.vocab_size})")
        seq = Sequence(ids, params, request_id=request_id, prompt=text)
        if seq.request_id in self._requests:
            raise ValueError(f"request id {seq.request_id!r} is already in use")
        if self.tokenizer is not None:
            seq.detok = IncrementalDetokenizer(self.tokenizer, ids, params.skip_special_tokens)
        self._requests[seq.request_id] = seq
        self.scheduler.add(seq)
        return seq.request_id

    def abort(self, request_id: str) -> None:
        """Cancel a request: its cache blocks and slot are freed at once."""
        seq = self._requests.pop(request_id, None)
        if seq is not None and not seq.finished:
            self.scheduler.finish(seq, "abort")

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    # ------------------------------------------------------------------------------------------ one step
    def _upload(self, arrays: dict) -> dict:
        be = self.backend
        return {k: be.upload_into(self._meta[k], v) for k, v in arrays.items()}

    def _run(self, chunks, logits_out=None):
        """Forward over ``chunks`` (see model.host_step_arrays); returns the device logits."""
        if chunks and any(len(c[0]) == 0 for c in chunks):
            raise ValueError("empty chunk")
        host = host_step_arrays(chunks, self.plan.block_size, self.max_blocks)
        dev = self._upload(host)
        T, N = int(host["ids"].shape[0]), len(chunks)
        step = Step(T=T, N=N, decode=all(len(c[0]) == 1 for c in chunks), ids=dev["ids"], positions=dev["positions"],
                    slot_mapping=dev["slot_mapping"], cu_seqlens=dev["cu_seqlens"], seq_lens=dev["seq_lens"],
                    block_tables=dev["block_tables"], gdn_slots=dev["gdn_slots"], logit_rows=dev["logit_rows"],
                    n_logits=int(host["logit_rows"].shape[0]))
        return self.model.forward(self.cache, step, logits_out)

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; returns the requests that produced a token (or finished) in it."""
        sched, new_slots = self.scheduler.schedule()
        if not sched:
            return []
        self.cache.reset_slots(new_slots)
        chunks, sampled = [], []
        for seq, n in sched:
            start = seq.num_computed
            last = start + n == seq.num_tokens
            chunks.append((seq.tokens[start:start + n], start, seq.block_table, seq.slot, "last" if last else None))
            if last:
                sampled.append(seq)
        bucket = None if self.graphs is None else self.graphs.bucket(chunks)
        logits = self._run(chunks) if bucket is None else self.graphs.run(chunks, bucket)
        for seq, n in sched:
            seq.num_computed += n
        if not sampled:
            return []
        res = self._sample(logits, sampled)
        return [self._append(seq, int(t), row_logprob(res, b, seq.params))
                for b, (seq, t) in enumerate(zip(sampled, res.tokens))]

    def _sample(self, logits, seqs: list[Sequence]):
        """Draw the sequences' next tokens (a sampler.SampleResult). A sequence with penalties reads the count
        row of its state slot; the row is set up (prompt bits + counts of the tokens it already produced) the
        first time the sequence samples in that slot -- also after a preemption moved it -- and the backend
        counts each drawn token."""
        init, slots = [], []
        for s in seqs:
            if s.params.has_penalties and s.slot is not None:
                if self._count_owner.get(s.slot) != s.seq_id:
                    init.append((s.slot, s.prompt_ids, s.output_ids))
                    self._count_owner[s.slot] = s.seq_id
                slots.append(s.slot)
            else:
                slots.append(-1)
        self.backend.init_counts(init)
        return self.backend.sample(logits, [s.params for s in seqs], [s.generator for s in seqs], slots=slots)

    @staticmethod
    def _stop_at(text: str, stops: list[str]) -> int | None:
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        return min(hits) if hits else None

    def _append(self, seq: Sequence, tok: int, lp: Logprob | None = None) -> RequestOutput:
        """Record a sampled token: detokenize, check the stop conditions, build the streaming output."""
        p = seq.params
        seq.output_ids.append(tok)
        if lp is not None:
            seq.logprobs.append(lp)
        reason = None
        stop_token = (not p.ignore_eos and tok in self.eos_ids) or tok in p.stop_token_ids
        if stop_token:
            reason = "stop"  # the stop token's text is not part of the output
        elif seq.detok is not None:
            seq.output_text += seq.detok.step(tok)
            cut = self._stop_at(seq.output_text, p.stop)
            if cut is not None:
                seq.output_text, reason = seq.output_text[:cut], "stop"
        if reason is None and (len(seq.output_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len):
            reason = "length"
        hold = 0
        if reason is not None:
            if seq.detok is not None:  # the decode of all output tokens is the authority on the final text
                ids = seq.output_ids[:-1] if stop_token else seq.output_ids
                full = self.tokenizer.decode(ids, skip_special_tokens=p.skip_special_tokens)
                cut = self._stop_at(full, p.stop)
                seq.output_text = full if cut is None else full[:cut]
            self.scheduler.finish(seq, reason)
            self._requests.pop(seq.request_id, None)
        else:
            hold = max((len(s) - 1 for s in p.stop), default=0)  # a stop string may still complete
        upto = max(seq.sent_chars, len(seq.output_text) - hold)
        delta = seq.output_text[seq.sent_chars:upto]
        seq.sent_chars = upto
        lps = None if p.logprobs is None else list(seq.logprobs)
        return RequestOutput(seq.request_id, seq.prompt, seq.prompt_ids, list(seq.output_ids), seq.output_text,
                             delta, [tok], seq.finished, seq.finish_reason, lps, None if lps is None else lps[-1:])

    # ------------------------------------------------------------------------------------------ batch API
    def generate(self, prompts, params: SamplingParams | list[SamplingParams] | None = None,
                 on_output=None) -> list[RequestOutput]:
        """Run every prompt (text or token-id list) to completion; outputs in prompt order. ``on_output`` gets
        each step's RequestOutputs (streaming)."""
        single = isinstance(prompts, str) or (len(prompts) > 0 and isinstance(prompts[0], (int, np.integer)))
        prompts = [prompts] if single else list(prompts)
        plist = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(plist)} SamplingParams for {len(prompts)} prompts")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        final: dict[str, RequestOutput] = {}
        while self.has_unfinished():
            outs = self.step()
            if on_output is not None and outs:
                on_output(outs)
            for o in outs:
                if o.finished:
                    final[o.request_id] = o
        return [final[i] for i in ids]

    def chat(self, conversations, params: SamplingParams | list[SamplingParams] | None = None,
             on_output=None, **template_kwargs) -> list[RequestOutput]:
        """:meth:`generate` on chat conversations (one list of {"role", "content"} messages, or several),
        rendered with the model's chat template (``template_kwargs``, e.g. ``enable_thinking=False``, go to it)."""
        if conversations and isinstance(conversations[0], dict):
            conversations = [conversations]
        prompts = [render_chat(self.chat_template, list(c), **template_kwargs) for c in conversations]
        return self.generate(prompts, params, on_output)

    def prompt_logits(self, token_ids: list[int], chunk: int | None = None) -> np.ndarray:
        """Teacher-forced logits [len(token_ids), V] (float32, host) of one sequence, prefilled in chunks of
        ``chunk`` tokens (default: the step budget). Uses and frees its own blocks and slot."""
        if self.scheduler.has_unfinished():
            raise RuntimeError("prompt_logits needs an idle engine")
        n = len(token_ids)
        if not 0 < n <= self.max_model_len:
            raise ValueError(f"prompt_logits needs 1 .. max_model_len ({self.max_model_len}) tokens, got {n}")
        chunk = min(chunk or self.max_num_batched_tokens, self.max_num_batched_tokens)
        pool, slots = self.scheduler.blocks, self.scheduler.slots
        table: list[int] = []
        slot = slots.take()
        try:
            pool.grow(table, n)
            self.cache.reset_slots([slot])
            out = []
            for s in range(0, n, chunk):
                toks = token_ids[s:s + chunk]
                buf = self.backend.empty((len(toks), self.cfg.vocab_size), "bf16")
                logits = self._run([(toks, s, table, slot, "all")], logits_out=buf)
                out.append(self.backend.logits_to_host(logits))
            return np.concatenate(out, axis=0)
        finally:
            pool.release(table)
            slots.release(slot)
