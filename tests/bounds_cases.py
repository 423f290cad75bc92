"""Adversarial device-index checks of every op that reads an index from device memory (issue 12), shared by
tests/test_bounds_interp.py (CPU, Triton's interpreter, every access checked against the op's tensors) and
tests/gpu/test_gpu_bounds.py (the H200, also run under compute-sanitizer by `tools/gpu/run.sh memcheck`).

Every tensor an op gets is a view into a larger buffer (:class:`Arena`) whose head and tail hold random
sentinel bytes; after the call those bytes must be unchanged, outputs must be right where the kernels define
a result, and bytes the kernels define as untouched (rows of skipped sequences, state slots no valid index
names) must be unchanged too. Index values: past the end, negative, decreasing offsets, 2^31 - 1, -2^31,
cu_seqlens[N] > T, duplicates. The semantics checked here are the ones the kernel docstrings define.

A check function takes an :class:`Env`: the torch device, ``wrap`` (how a torch view is handed to an op:
as is on the GPU, as a ``__cuda_array_interface__`` stand-in on the CPU) and ``sync``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from tests import refs, refs_attn as RA, refs_gdn as RG, refs_gdn_decode as RC

BIG = 2**31 - 1
SMALL = -2**31
TOL = 1e-2


@dataclass
class Env:
    device: str
    wrap: Callable = lambda t: t
    sync: Callable = lambda: None


# ------------------------------------------------------------------------------------------- sentinel arena

ACTIVE: list = []  # arenas made since the last clear (the CPU harness resolves kernel pointers in them)


class Arena:
    """Tensors as views into larger buffers: [head sentinel | view | tail sentinel], sentinels random bytes
    (NaN/Inf patterns and huge integers among them), each region 64-byte aligned."""

    def __init__(self, seed: int, device: str):
        self.g = torch.Generator().manual_seed(seed)
        self.device = device
        self.bufs = []  # (buffer uint8, offset of the view, view bytes, snapshot of the buffer)
        ACTIVE.append(self)

    def owns(self, addr: int) -> bool:
        return any(b.data_ptr() <= addr < b.data_ptr() + b.numel() for b, _, _, _ in self.bufs)

    def put(self, data: torch.Tensor) -> torch.Tensor:
        """A view holding ``data`` (copied)."""
        data = data.contiguous()
        n = data.numel() * data.element_size()
        pad = 256 + -(-max(n, 1) // 64) * 64
        raw = torch.randint(0, 256, (pad + n + pad,), dtype=torch.uint8, generator=self.g)
        buf = raw.to(self.device)
        view = buf[pad:pad + n].view(data.dtype).view(data.shape)
        view.copy_(data.to(self.device))
        self.bufs.append([buf, pad, n, buf.clone()])
        return view

    def poison(self, shape, dtype) -> torch.Tensor:
        """A view of random bytes (an output or scratch whose unwritten parts must stay as they are)."""
        n = int(np.prod(shape)) * torch.empty((), dtype=dtype).element_size()
        raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=self.g)
        return self.put(raw.view(dtype).view(tuple(shape)))

    def check(self) -> None:
        """Every sentinel byte is unchanged."""
        for buf, off, n, snap in self.bufs:
            assert torch.equal(buf[:off], snap[:off]), f"bytes before a {n}-byte view were written"
            assert torch.equal(buf[off + n:], snap[off + n:]), f"bytes after a {n}-byte view were written"

    def ranges(self) -> list[tuple[int, int]]:
        """Byte ranges [lo, hi) of the views (what a kernel may touch)."""
        return [(b.data_ptr() + off, b.data_ptr() + off + n) for b, off, n, _ in self.bufs]

    def view_at(self, addr: int, dtype: torch.dtype) -> torch.Tensor:
        """A 1-D view of dtype starting at address ``addr`` inside one of the buffers."""
        isz = torch.empty((), dtype=dtype).element_size()
        for b, _, _, _ in self.bufs:
            lo = b.data_ptr()
            if lo <= addr < lo + b.numel():
                off = addr - lo
                cnt = (b.numel() - off) // isz
                return b[off:off + cnt * isz].view(dtype)
        raise AssertionError(f"pointer {addr:#x} is not inside any tensor of the test")


def device_array(view: torch.Tensor, dtype: str):
    """A vkc_runtime DeviceArray over an arena view (workspaces)."""
    from vkc_runtime import memory
    return memory.DeviceArray(tuple(view.shape), dtype, ptr=view.data_ptr(), base=view)


def rnd(g, *shape, scale=1.0):
    return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16)


def i32(vals) -> torch.Tensor:
    return torch.tensor(vals, dtype=torch.int64).to(torch.int32)


def np64(t) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype(np.float64)


def close(out, ref, what):
    o = np64(out)
    assert np.isfinite(o).all(), f"{what}: non-finite values"
    err = refs.rel_err(o, ref)
    assert err < TOL, f"{what}: relative error {err:.3e}"


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


# ------------------------------------------------------------------------------------------------ semantics

def prefill_processed(cu, T) -> list[bool]:
    """kernels_src/attn/prefill.py: sequence i runs iff 0 <= cu[i] <= cu[i+1] <= T and cu[i+1] <= every later
    offset."""
    cu = [int(x) for x in cu]
    return [0 <= cu[i] <= cu[i + 1] <= min([T] + cu[i + 1:]) for i in range(len(cu) - 1)]


def clamped_bounds(cu, T) -> list[tuple[int, int]]:
    """GDN chunk_index / conv prefill: sequence n covers [clamp(cu[n], 0, T), clamp(cu[n+1], that, T))."""
    cu = [int(x) for x in cu]
    out = []
    for n in range(len(cu) - 1):
        lo = min(max(cu[n], 0), T)
        out.append((lo, min(max(cu[n + 1], lo), T)))
    return out


def disjoint(bounds) -> bool:
    iv = sorted((a, b) for a, b in bounds if b > a)
    return all(iv[i][1] <= iv[i + 1][0] for i in range(len(iv) - 1))


def valid_slot(s, n) -> bool:
    return 0 <= int(s) < n


# ------------------------------------------------------------------------------------------ attention: paged

def make_paged(arena, g, lens, Hkv, D, bs, bad_cols=2):
    """Shuffled paged caches (arena views) with random rows 0..L-1 per sequence and NaN elsewhere; block-table
    columns past a sequence's blocks hold garbage ids (past the end, negative, 2^31 - 1, -2^31)."""
    cd = lambda a, b: -(-a // b)  # noqa: E731
    nblk = [cd(max(L, 0), bs) for L in lens]
    nb = sum(nblk) + 2
    perm = torch.randperm(nb, generator=g)
    width = max(max(nblk), 1) + bad_cols
    garbage = [nb, -1, BIG, SMALL, 10**6]
    bt = torch.tensor([[garbage[(i + j) % len(garbage)] for j in range(width)] for i in range(len(lens))],
                      dtype=torch.int64).to(torch.int32)
    kc = torch.full((nb, bs, Hkv, D), float("nan"), dtype=torch.bfloat16)
    vc = torch.full_like(kc, float("nan"))
    used = 0
    for i, L in enumerate(lens):
        ids = perm[used:used + nblk[i]]
        used += nblk[i]
        bt[i, :nblk[i]] = ids.to(torch.int32)
        for n in range(max(L, 0)):
            kc[ids[n // bs], n % bs] = rnd(g, Hkv, D)
            vc[ids[n // bs], n % bs] = rnd(g, Hkv, D)
    return kc, vc, bt


PREFILL_T = 150
PREFILL_PREFIX = [3, 20, 0]
PREFILL_CU = {
    "valid": [0, 10, 140, 150],          # the middle sequence spans several m-blocks
    "past_end": [0, 10, 140, 170],       # cu[N] > T
    "negative": [-4, 10, 140, 150],
    "decreasing": [0, 30, 20, 150],
    "overlap": [0, 100, 10, 150],        # sequence 2 starts before sequence 0 ends
    "huge_hi": [0, 10, BIG, BIG],
    "huge_mid": [0, BIG, 5, 150],
    "min_lo": [SMALL, 10, 140, 150],
    "gap": [5, 10, 10, 140],             # rows 0..4 and 140..149 in no sequence, an empty one
    "all_bad": [BIG, SMALL, BIG, SMALL],
}


def check_prefill(env: Env, A, case: str, use_tma: bool, small_grid: bool, D=256, Hq=2, Hkv=1, gate=True):
    """prefill over adversarial cu_seqlens_q: processed sequences match the reference, every other row of out
    keeps its bytes, sentinels survive; with small_grid a max_seqlen_q of 1 gives the identical bytes."""
    T, cu = PREFILL_T, PREFILL_CU[case]
    ok = prefill_processed(cu, T)
    g = torch.Generator().manual_seed(11 + len(case))
    qlen = [(cu[i + 1] - cu[i]) if ok[i] else 0 for i in range(3)]
    lens = [p + q for p, q in zip(PREFILL_PREFIX, qlen)]
    bs = 64 if use_tma else 16
    ar = Arena(3, env.device)
    kc, vc, bt = (ar.put(t) for t in make_paged(ar, g, lens, Hkv, D, bs))
    q = ar.put(rnd(g, T, Hq, D))
    qg = ar.put(rnd(g, T, Hq, 2, D)) if gate else None
    gt = qg[:, :, 1] if gate else None
    cut, sl = ar.put(i32(cu)), ar.put(i32(lens))
    outs = []
    before = ar.poison((T, Hq, D), torch.bfloat16).clone()
    for msq in ((None, 1) if small_grid else (None,)):
        out = ar.put(before)  # both calls start from the same poisoned bytes
        w = env.wrap
        A.prefill(w(q), w(kc), w(vc), w(bt), w(cut), w(sl), D ** -0.5, gate=None if gt is None else w(gt),
                  out=w(out), max_seqlen_q=msq, use_tma=use_tma)
        env.sync()
        ar.check()
        rows = torch.zeros(T, dtype=torch.bool)
        for i in range(3):
            if not ok[i]:
                continue
            a, b = cu[i], cu[i + 1]
            rows[a:b] = True
            if b > a:
                ref = RA.prefill(np64(q), np64(kc), np64(vc), bt.cpu().numpy()[i:i + 1], [a, b], [lens[i]],
                                 D ** -0.5, None if gt is None else np64(gt))
                close(out[a:b], ref[a:b], f"prefill {case} sequence {i} (max_seqlen_q={msq})")
        untouched = (~rows).nonzero().flatten().to(out.device)
        assert same_bytes(out[untouched], before[untouched]), f"prefill {case}: a row of no processed sequence changed"
        outs.append(out)
    if small_grid:
        assert same_bytes(outs[0], outs[1]), f"prefill {case}: max_seqlen_q=1 changed the result"


def check_prefill_bad_lengths(env: Env, A, use_tma: bool, D=256, Hq=2, Hkv=1):
    """Valid offsets, but seq_lens negative / 2^31 - 1 and garbage block ids: in bounds; a length <= 0 gives
    zero rows, the sequence with consistent data is right."""
    T, cu = PREFILL_T, PREFILL_CU["valid"]
    g = torch.Generator().manual_seed(5)
    lens = [PREFILL_PREFIX[i] + cu[i + 1] - cu[i] for i in range(3)]
    bs = 64 if use_tma else 16
    ar = Arena(4, env.device)
    kc, vc, bt = make_paged(ar, g, lens, Hkv, D, bs)
    bt[1, 0] = -5  # a bad id in the middle of sequence 1's table
    kc, vc, bt = ar.put(kc), ar.put(vc), ar.put(bt)
    q = ar.put(rnd(g, T, Hq, D))
    sl = ar.put(i32([-7, BIG, lens[2]]))
    out = ar.poison((T, Hq, D), torch.bfloat16)
    w = env.wrap
    A.prefill(w(q), w(kc), w(vc), w(bt), w(ar.put(i32(cu))), w(sl), D ** -0.5, out=w(out), use_tma=use_tma)
    env.sync()
    ar.check()
    assert torch.all(out[0:10].float() == 0), "a sequence with seq_lens < 0 sees no key: zero rows"
    ref = RA.prefill(np64(q), np64(kc), np64(vc), bt.cpu().numpy()[2:3], [140, 150], [lens[2]], D ** -0.5)
    close(out[140:150], ref[140:150], "prefill sequence with consistent data")


# ----------------------------------------------------------------------------------------- attention: decode

def check_decode(env: Env, A, splits: int, fused: bool, D=256, Hq=4, Hkv=2, bs=16):
    """decode over adversarial seq_lens (negative, 2^31 - 1, -2^31, past the table) and block ids; block size 64
    takes the TMA kernels on sm_90a / sm_100a (a garbage id's tile reads block 0 in bounds and is discarded)."""
    g = torch.Generator().manual_seed(20 + splits)
    lens = [5, 40, 0, 17, 33] if bs == 16 else [5, 150, 0, 70, 130]
    ar = Arena(6, env.device)
    kc, vc, bt = make_paged(ar, g, lens, Hkv, D, bs)
    bt[4, 1] = BIG  # sequence 4's second block is garbage
    kc, vc, bt = ar.put(kc), ar.put(vc), ar.put(bt)
    B = len(lens)
    q = ar.put(rnd(g, B, Hq, D))
    gate = ar.put(rnd(g, B, Hq, D))
    sl = ar.put(i32([-5, BIG, SMALL, lens[3], lens[4]]))
    from vkc_runtime.ops.attn import DecodeWorkspace
    ms = max(splits, 2)
    # block 64: the TMA kernels' descriptor scratch (None where the arch has none); block 16 needs none
    tma_scratch = A.decode_workspace(B, Hq, D, ms, num_kv_heads=Hkv).scratch if bs % 64 == 0 else None
    ws = DecodeWorkspace(device_array(ar.poison((B * Hq * ms * D,), torch.float32), "float32"),
                         device_array(ar.poison((B * Hq * ms,), torch.float32), "float32"),
                         device_array(ar.put(torch.zeros(B * Hq, dtype=torch.int32)), "int32"), B, Hq, D, ms,
                         tma_scratch, Hkv)
    out = ar.poison((B, Hq, D), torch.bfloat16)
    w = env.wrap
    A.decode(w(q), w(kc), w(vc), w(bt), w(sl), D ** -0.5, gate=w(gate), out=w(out), workspace=ws,
             num_splits=splits, fused=fused, max_seq_len=bt.shape[1] * bs)
    env.sync()
    ar.check()
    assert torch.all(out[0].float() == 0) and torch.all(out[2].float() == 0), "seq_lens <= 0: zero output"
    ref = RA.decode(np64(q[3:4]), np64(kc), np64(vc), bt.cpu().numpy()[3:4], [lens[3]], D ** -0.5,
                    np64(gate[3:4]))
    close(out[3:4], ref, f"decode splits={splits} fused={fused}")
    keep = bt.cpu().numpy()[4:5, [0, 2]]  # sequence 4 without its garbage second block: those keys do not count
    ref = RA.decode(np64(q[4:5]), np64(kc), np64(vc), keep, [lens[4] - bs], D ** -0.5, np64(gate[4:5]))
    close(out[4:5], ref, f"decode splits={splits} fused={fused}: a garbage block id skipped")


def check_reshape_and_cache(env: Env, A, D=128, Hkv=2, nb=3, bs=16):
    """slot_mapping: negative, past the end, 2^31 - 1, -2^31, duplicates."""
    g = torch.Generator().manual_seed(30)
    NS = nb * bs
    slots = [5, -1, BIG, SMALL, NS, NS - 1, 5, 0]
    T = len(slots)
    ar = Arena(7, env.device)
    k, v = ar.put(rnd(g, T, Hkv, D)), ar.put(rnd(g, T, Hkv, D))
    kc, vc = ar.put(rnd(g, nb, bs, Hkv, D)), ar.put(rnd(g, nb, bs, Hkv, D))
    kc0, vc0 = kc.clone(), vc.clone()
    w = env.wrap
    A.reshape_and_cache(w(k), w(v), w(kc), w(vc), w(ar.put(i32(slots))))
    env.sync()
    ar.check()
    for cache, old, new in ((kc, kc0, k), (vc, vc0, v)):
        flat, flat0 = cache.view(NS, Hkv, D), old.view(NS, Hkv, D)
        assert torch.equal(flat[NS - 1], new[5]) and torch.equal(flat[0], new[7])
        # two programs store the duplicate slot concurrently: each element holds one of the two rows' values (the
        # stores are not atomic per row; seen interleaved on the H100 in session 24)
        assert torch.all((flat[5] == new[0]) | (flat[5] == new[6])), "a duplicate slot holds a third value"
        rest = [s for s in range(NS) if s not in (0, 5, NS - 1)]
        assert torch.equal(flat[rest], flat0[rest]), "a slot no valid index names changed"


# ---------------------------------------------------------------------------------------------------- GDN

GDN_T = 70
GDN_CASES = {  # name: (cu_seqlens, slot_idx)
    "valid": ([0, 5, 69, 70], [1, 3, -1]),
    "past_end": ([0, 5, 60, 90], [1, BIG, 0]),
    "negative": ([-9, 5, 60, 70], [SMALL, 4, 0]),   # slot 4 == number of slots
    "huge": ([0, 5, BIG, BIG], [2, 0, 1]),
    "min_lo": ([SMALL, 5, 70, BIG], [3, -1, 2]),
    "decreasing": ([0, 40, 10, 70], [1, 3, 0]),     # sequence 2 overlaps sequence 0: bounds only
    "duplicate_slots": ([0, 5, 69, 70], [2, 2, 0]),  # bounds only for slot 2
}


def gdn_inputs(g, T, hk, hv):
    C = 2 * hk * 128 + hv * 128
    return (torch.randn(T, C, generator=g).to(torch.bfloat16), (torch.randn(T, hv, generator=g) * 2).to(torch.bfloat16),
            (torch.randn(T, hv, generator=g) * 2).to(torch.bfloat16), torch.rand(hv, generator=g) * 2 - 1,
            torch.randn(hv, generator=g) * 0.5)


def gdn_workspace(ar, G, T, N, hk, hv):
    C = G.max_chunks(T, N)
    da = device_array
    bf, f32, i = torch.bfloat16, torch.float32, torch.int32
    return G.GdnWorkspace(
        T, N, hk, hv, -1, da(ar.poison((N, 4), i), "int32"), da(ar.poison((C, 2), i), "int32"),
        da(ar.poison((T, hk, 128), bf), "bfloat16"), da(ar.poison((T, hk, 128), bf), "bfloat16"),
        da(ar.poison((T, hv), f32), "float32"), da(ar.poison((T, hv), f32), "float32"),
        da(ar.poison((T, hv, 128), bf), "bfloat16"), da(ar.poison((T, hv, 128), bf), "bfloat16"),
        da(ar.poison((C, hv, 128, 128), bf), "bfloat16"), da(ar.poison((16,), f32), "float32"),
        da(ar.poison((4,), i), "int32"))


def check_gdn(env: Env, G, case: str, hk=1, hv=2, nslots=4):
    cu, slots = GDN_CASES[case]
    T = GDN_T
    g = torch.Generator().manual_seed(40 + len(case))
    ar = Arena(8, env.device)
    qkv, a, b, A_log, dt = (ar.put(t) for t in gdn_inputs(g, T, hk, hv))
    state = ar.put(torch.randn(nslots, hv, 128, 128, generator=g) * 0.1)
    state0 = state.clone()
    out = ar.poison((T, hv, 128), torch.bfloat16)
    out0 = out.clone()
    ws = gdn_workspace(ar, G, T, 3, hk, hv)
    w = env.wrap
    G.chunk_gated_delta_rule(w(qkv), w(a), w(b), w(A_log), w(dt), w(ar.put(i32(cu))), hk, hv, state=w(state),
                             slot_idx=w(ar.put(i32(slots))), out=w(out), workspace=ws)
    env.sync()
    ar.check()
    bounds = clamped_bounds(cu, T)
    named = {int(s) for s, (lo, hi) in zip(slots, bounds) if valid_slot(s, nslots)}
    rest = [s for s in range(nslots) if s not in named]
    assert torch.equal(state[rest], state0[rest]), f"gdn {case}: a slot no valid index names changed"
    covered = torch.zeros(T, dtype=torch.bool)
    for lo, hi in bounds:
        covered[lo:hi] = True
    free = (~covered).nonzero().flatten().to(out.device)
    assert same_bytes(out[free], out0[free]), f"gdn {case}: a row of no sequence was written"
    if not disjoint(bounds) or len(named) < sum(valid_slot(s, nslots) for s in slots):
        return  # overlapping sequences / shared slots: unspecified values, bounds checked above
    args = [np64(x) for x in (qkv, a, b, A_log, dt)]
    ref_o, ref_s, written = np.zeros((T, hv, 128)), np64(state0), []
    for n, (lo, hi) in enumerate(bounds):
        sl = int(slots[n]) if valid_slot(slots[n], nslots) else -1
        if hi == lo:
            if sl >= 0:
                assert torch.equal(state[sl], state0[sl]), f"gdn {case}: an empty sequence's slot changed"
            continue
        ro, rs = RG.recurrent(*[x[lo:hi] for x in args[:3]], *args[3:], [0, hi - lo], hk, hv, np64(state0), [sl])
        ref_o[lo:hi] = ro
        if sl >= 0:
            ref_s[sl] = rs[sl]
            written.append(sl)
    rows = covered.nonzero().flatten()
    close(out[rows.to(out.device)], ref_o[rows.numpy()], f"gdn {case} output")
    if written:
        close(state[written], ref_s[written], f"gdn {case} states")


def check_gdn_decode(env: Env, GD, hk=1, hv=2, nslots=3):
    """slot_idx: valid, -1, 2^31 - 1, -2^31, == slots; then a duplicate pair."""
    g = torch.Generator().manual_seed(50)
    for slots in ([1, -1, BIG, SMALL, nslots, 0], [2, 2, 0]):
        B = len(slots)
        ar = Arena(9, env.device)
        qkv, a, b, A_log, dt = (ar.put(t) for t in gdn_inputs(g, B, hk, hv))
        state = ar.put(torch.randn(nslots, hv, 128, 128, generator=g) * 0.1)
        state0 = state.clone()
        out = ar.poison((B, hv, 128), torch.bfloat16)
        w = env.wrap
        GD.recurrent_decode(w(qkv), w(a), w(b), w(A_log), w(dt), w(state), w(ar.put(i32(slots))), hk, hv, out=w(out))
        env.sync()
        ar.check()
        named = {int(s) for s in slots if valid_slot(s, nslots)}
        rest = [s for s in range(nslots) if s not in named]
        assert torch.equal(state[rest], state0[rest]), "gdn_decode: a slot no valid index names changed"
        for i, s in enumerate(slots):
            if not valid_slot(s, nslots):
                assert torch.all(out[i].float() == 0), "gdn_decode: an invalid slot gives zeros"
        if len(named) == len([s for s in slots if valid_slot(s, nslots)]):
            ro, rs = RC.gdn_decode(*[np64(x) for x in (qkv, a, b, A_log, dt)], np64(state0), slots, hk, hv)
            close(out, ro, "gdn_decode output")
            close(state, rs, "gdn_decode state")


# --------------------------------------------------------------------------------------------------- conv

CONV_T = 130  # programs of 16 rows (the spec's 4 x 4): sequences cross program boundaries
CONV_CASES = {  # name: (cu_seqlens, slot_idx)
    "valid": ([0, 2, 127, 130], [1, -1, 0]),
    "past_end": ([0, 2, 127, 141], [1, 2, 0]),      # the last sequence's first rows cross T
    "negative": ([-6, 2, 127, 130], [BIG, 3, 0]),   # slot 3 == number of slots
    "huge": ([0, 2, 127, BIG], [SMALL, 1, 2]),
    "huge_first": ([0, BIG, BIG, BIG], [1, 0, 2]),
    "min_lo": ([SMALL, 2, 127, 130], [0, 1, 2]),
    "late_start": ([4, 10, 127, 130], [0, 1, 2]),   # rows 0..3 in no sequence: zeros
    "decreasing": ([0, 100, 20, 130], [0, 1, 2]),   # non-monotone: bounds only
    "duplicate_slots": ([0, 2, 127, 130], [1, 1, 0]),
}


def check_conv(env: Env, CV, case: str, C=128, nslots=3, pad=0):
    """pad: x, y and the state rows are the first C columns of rows of C + pad (row strides C + pad)."""
    cu, slots = CONV_CASES[case]
    T = CONV_T
    g = torch.Generator().manual_seed(60 + len(case) + C)
    ar = Arena(10, env.device)
    x, wt = ar.put(rnd(g, T, C + pad))[:, :C], ar.put(rnd(g, C, 4, scale=0.5))
    st = ar.put(rnd(g, nslots, 3, C + pad))[:, :, :C]
    st0 = st.clone()
    yp = ar.poison((T, C + pad), torch.bfloat16)
    y, pad0 = yp[:, :C], yp[:, C:].clone()
    w = env.wrap
    CV.causal_conv1d(w(x), w(wt), w(ar.put(i32(cu))), conv_state=w(st), slot_idx=w(ar.put(i32(slots))), out=w(y))
    env.sync()
    ar.check()
    bounds = clamped_bounds(cu, T)
    named = {int(s) for s, (lo, hi) in zip(slots, bounds) if valid_slot(s, nslots) and hi > lo}
    rest = [s for s in range(nslots) if s not in named]
    assert torch.equal(st[rest], st0[rest]), f"conv {case}: a slot no non-empty valid sequence names changed"
    monotone = all(int(cu[i]) <= int(cu[i + 1]) for i in range(len(cu) - 1))
    if not monotone or len(named) < sum(valid_slot(s, nslots) and hi > lo for s, (lo, hi) in zip(slots, bounds)):
        return  # unspecified values, bounds checked above
    ref = np.zeros((T, C))
    new = np64(st0)
    for n, (lo, hi) in enumerate(bounds):
        if hi == lo:
            continue
        sl = int(slots[n]) if valid_slot(slots[n], nslots) else -1
        yr, ns = RC.conv_prefill(np64(x[lo:hi]), np64(wt), [0, hi - lo], np64(st0), [sl])
        ref[lo:hi] = yr
        if sl >= 0:
            new[sl] = ns[sl]
    close(y, ref, f"conv {case} output")  # rows in no sequence: zeros
    assert np.array_equal(np64(st), new), f"conv {case}: final states"
    if pad:
        assert torch.equal(yp[:, C:].view(torch.int16), pad0.view(torch.int16)), f"conv {case}: wrote past the row"


def check_conv_update(env: Env, CV, C=128, nslots=3):
    g = torch.Generator().manual_seed(70)
    for slots in ([1, -1, BIG, SMALL, nslots, 0], [2, 2, 0]):
        B = len(slots)
        ar = Arena(11, env.device)
        x, wt = ar.put(rnd(g, B, C)), ar.put(rnd(g, C, 4, scale=0.5))
        st = ar.put(rnd(g, nslots, 3, C))
        st0 = st.clone()
        y = ar.poison((B, C), torch.bfloat16)
        w = env.wrap
        CV.causal_conv1d_update(w(x), w(wt), w(st), w(ar.put(i32(slots))), out=w(y))
        env.sync()
        ar.check()
        named = {int(s) for s in slots if valid_slot(s, nslots)}
        rest = [s for s in range(nslots) if s not in named]
        assert torch.equal(st[rest], st0[rest]), "conv update: a slot no valid index names changed"
        if len(named) == len([s for s in slots if valid_slot(s, nslots)]):
            yr, ns = RC.conv_update(np64(x), np64(wt), np64(st0), slots)
            close(y, yr, "conv update output")
            assert np.array_equal(np64(st), ns), "conv update: states"


# --------------------------------------------------------------------------------------------------- norm

def check_embedding(env: Env, EM, V=7, N=96):
    g = torch.Generator().manual_seed(80)
    ids = [0, -1, V, BIG, SMALL, V - 1, 3]
    ar = Arena(12, env.device)
    table = ar.put(rnd(g, V, N))
    out = ar.poison((len(ids), N), torch.bfloat16)
    w = env.wrap
    EM.embedding(w(ar.put(i32(ids))), w(table), out=w(out))
    env.sync()
    ar.check()
    assert np.array_equal(np64(out), refs.embedding(ids, np64(table))), "embedding: ids outside [0, V) give zeros"


def check_rope_positions(env: Env, RO, Hq=2, Hkv=1, D=128):
    """Positions are values (angles), never addresses: extreme ones stay in bounds and finite."""
    g = torch.Generator().manual_seed(90)
    pos = [0, -1, BIG, SMALL, 5]
    T = len(pos)
    ar = Arena(13, env.device)
    qg, k = ar.put(rnd(g, T, Hq * 2 * D)), ar.put(rnd(g, T, Hkv * D))
    wq, wk = ar.put(rnd(g, D, scale=0.1)), ar.put(rnd(g, D, scale=0.1))
    qo, ko = ar.poison((T, Hq, D), torch.bfloat16), ar.poison((T, Hkv, D), torch.bfloat16)
    w = env.wrap
    RO.qk_norm_rope(w(qg), w(k), w(ar.put(i32(pos))), w(wq), w(wk), Hq, Hkv, D, q_out=w(qo), k_out=w(ko))
    env.sync()
    ar.check()
    assert np.isfinite(np64(qo)).all() and np.isfinite(np64(ko)).all()
