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


@dataclass
class _Launched:
    """A step on the device whose draws the host has not read: its sampled sequences in row order and the
    backend's pending draws (``.tokens``: device int32 [B]; ``.result()``: waits, a sampler.SampleResult)."""
    seqs: list[Sequence]
    pending: object


class _Drawn:
    """Draws already on the host, in the pending-draws interface (a backend without ``sample_async``)."""

    def __init__(self, res):
        self.res, self.tokens = res, None

    def result(self):
        return self.res


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
    ``async_scheduling``: overlap each step's host work with the next step's device work (:meth:`step`; on
    backends with ``sample_async`` / ``copy_rows``); False runs every step to its end before returning.
    """

    def __init__(self, model_dir, *, backend=None, max_num_seqs: int = 32, max_num_batched_tokens: int = 2048,
                 max_model_len: int | None = None, block_size: int = 64, memory_fraction: float = 0.85,
                 num_blocks: int | None = None, load_format: str = "safetensors", progress=None, log=None,
                 enforce_eager: bool = False, strict_graphs: bool = False, quantized_experts: bool = True,
                 async_scheduling: bool = True):
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
        self._async_backend = bool(getattr(be, "supports_async_sampling", False))
        self.async_scheduling = bool(async_scheduling) and self._async_backend
        self._inflight: _Launched | None = None  # the step whose draws are still on the device
        self.num_ahead_steps = 0  # steps that took some input token straight from the previous step's draws
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
        """Finish the step in flight and release the CUDA graphs (the engine keeps running eagerly if used
        afterwards)."""
        self.drain()
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

    def _run(self, chunks, logits_out=None, patch=None):
        """Forward over ``chunks`` (see model.host_step_arrays); returns the device logits. ``patch(ids)``
        rewrites device token ids after their upload (overlapped steps)."""
        if chunks and any(len(c[0]) == 0 for c in chunks):
            raise ValueError("empty chunk")
        host = host_step_arrays(chunks, self.plan.block_size, self.max_blocks)
        dev = self._upload(host)
        if patch is not None:
            patch(dev["ids"])
        T, N = int(host["ids"].shape[0]), len(chunks)
        step = Step(T=T, N=N, decode=all(len(c[0]) == 1 for c in chunks), ids=dev["ids"], positions=dev["positions"],
                    slot_mapping=dev["slot_mapping"], cu_seqlens=dev["cu_seqlens"], seq_lens=dev["seq_lens"],
                    block_tables=dev["block_tables"], gdn_slots=dev["gdn_slots"], logit_rows=dev["logit_rows"],
                    n_logits=int(host["logit_rows"].shape[0]))
        return self.model.forward(self.cache, step, logits_out)

    def step(self) -> list[RequestOutput]:
        """Run one scheduled batch; returns the requests that produced a token (or finished).

        With ``async_scheduling`` (the default where the backend can) steps overlap: this call queues the next
        step on the device -- the sequences whose tokens the previous step is still drawing get them straight
        from the device (``_launch``) -- and only then waits for the previous step's tokens and processes them
        (detokenization, stop checks, streaming), so the host work of a step hides behind the device work of
        the next. The outputs returned are the previous step's (the first call returns none). A sequence that
        stops on a token (EOS, stop string) has had one more row computed for it by then: that row's token is
        dropped; a stop by length is known in advance and costs nothing."""
        prev, self._inflight = self._inflight, None
        outs: list[RequestOutput] = []
        if prev is not None and not self.async_scheduling:  # switched off since: finish it first
            outs, prev = self._complete(prev), None
        cur = self._launch(prev)
        if prev is not None:
            outs += self._complete(prev)
        if cur is not None:
            if self.async_scheduling:
                self._inflight = cur
            else:
                outs += self._complete(cur)
        return outs

    def drain(self) -> list[RequestOutput]:
        """Wait for the step in flight (overlapped steps) and process its tokens; returns its outputs."""
        prev, self._inflight = self._inflight, None
        return [] if prev is None else self._complete(prev)

    def _launch(self, prev: _Launched | None) -> _Launched | None:
        """Schedule a step, queue its forward and its draws on the device; None when nothing was scheduled or
        no row was sampled. A row whose token ``prev`` draws (the sequence's ``ahead``) is uploaded as 0 and
        overwritten on the device by that draw (backend.copy_rows) before the forward reads it."""
        sched, new_slots = self.scheduler.schedule()
        if not sched:
            return None
        self.cache.reset_slots(new_slots)
        chunks, sampled, patches, row = [], [], [], 0
        for seq, n in sched:
            start = seq.num_computed
            toks = seq.token_slice(start, n)
            if len(toks) < n:  # its last token is prev's draw, still on the device
                src, src_row = seq.ahead_src
                if src is not prev or len(toks) != n - 1:
                    raise RuntimeError(f"sequence {seq.request_id}: its next token is not the last step's draw")
                patches.append((row + n - 1, src_row))
                toks = toks + [0]
            last = start + n == seq.num_tokens
            chunks.append((toks, start, seq.block_table, seq.slot, "last" if last else None))
            if last:
                sampled.append(seq)
            row += n
        patch = None
        if patches:
            self.num_ahead_steps += 1
            patch = lambda ids: self._patch_ids(ids, patches, prev.pending.tokens)  # noqa: E731
        bucket = None if self.graphs is None else self.graphs.bucket(chunks)
        logits = self._run(chunks, patch=patch) if bucket is None else self.graphs.run(chunks, bucket, patch)
        for seq, n in sched:
            seq.num_computed += n
        if not sampled:
            return None
        cur = _Launched(sampled, self._sample(logits, sampled))
        for b, seq in enumerate(sampled):
            seq.num_inflight += 1
            final = (len(seq.output_ids) + seq.num_inflight >= seq.params.max_tokens
                     or seq.num_known + seq.num_inflight >= self.max_model_len)
            # a draw that ends the sequence by length feeds no step; any other is the next step's input
            seq.ahead, seq.ahead_src = (0, None) if final else (1, (cur, b))
        return cur

    def _patch_ids(self, ids, patches, src) -> None:
        """ids[d] = src[s] on the device for each (d, s) of ``patches``, one copy per run of consecutive pairs."""
        i = 0
        while i < len(patches):
            d0, s0 = patches[i]
            n = 1
            while i + n < len(patches) and patches[i + n] == (d0 + n, s0 + n):
                n += 1
            self.backend.copy_rows(ids, d0, src, s0, n)
            i += n

    def _complete(self, cur: _Launched) -> list[RequestOutput]:
        """Wait for a launched step's draws and record them; a sequence finished meanwhile (stopped, aborted)
        drops its token."""
        res = cur.pending.result()
        outs = []
        for b, seq in enumerate(cur.seqs):
            seq.num_inflight -= 1
            if seq.ahead and seq.ahead_src[0] is cur:  # no later step took it: now a known token
                seq.ahead, seq.ahead_src = 0, None
            if not seq.finished:
                outs.append(self._append(seq, int(res.tokens[b]), row_logprob(res, b, seq.params)))
        return outs

    def _sample(self, logits, seqs: list[Sequence]):
        """Queue the draws of the sequences' next tokens; returns the backend's pending draws (``.tokens`` on
        the device, ``.result()`` a sampler.SampleResult). A sequence with penalties reads the count row of its
        state slot; the row is set up (prompt bits + counts of the tokens it already produced) the first time
        the sequence samples in that slot -- also after a preemption moved it -- and the backend counts each
        drawn token."""
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
        args = (logits, [s.params for s in seqs], [s.generator for s in seqs])
        if self._async_backend:
            return self.backend.sample_async(*args, slots=slots)
        return _Drawn(self.backend.sample(*args, slots=slots))

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
        if reason is None and (len(seq.output_ids) >= p.max_tokens or seq.num_known >= self.max_model_len):
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
        self.drain()  # a step of finished sequences only may still be in flight
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
