"""Grouping of the (token, pick) pairs by expert on the device (no host sync), for the grouped GEMMs.

Input: ``ids`` int32 [P] (the router's topk_ids [M, k'] flattened: pair f = m * k' + j). Output, with
E' experts and the tile height ``block_m``:

  sorted_ids   int32 [cap]: expert 0's pairs (in pair order), padded with the sentinel P to a multiple of
               block_m, then expert 1's, ...; every entry at or past num_padded is P too
  block_expert int32 [cap // block_m]: the expert of rows [b*block_m, (b+1)*block_m), -1 past num_padded
  num_padded   int32 [1]: sum over experts of count rounded up to block_m (experts without pairs get no rows)

An id outside [0, E') is in no group (dropped). cap = P + E' * (block_m - 1) rounded up to block_m is
enough for any ids (the op checks the buffers against it); every store is also masked to [0, cap).

  align_hist_kernel     grid (n_chunks,): hist[c, e] = number of valid pairs of chunk c (CH pairs) with id e
                        (row length EB >= E'). Only used when P > CH.
  align_scatter_kernel  grid (E',): program e sums the histogram rows in fixed order (n_chunks = 0: it
                        histograms the ids itself, one step when P <= CH), takes its group's offset from the
                        padded counts, writes its pairs in pair order (a scan of the ids, skipped when it has
                        none), its padding and its blocks' expert; every program writes a share of the tail
                        past num_padded, program 0 writes num_padded.
"""
import triton
import triton.language as tl


@triton.jit
def _hist(ids_ptr, start, P, E, CH: tl.constexpr, EB: tl.constexpr):
    offs = start + tl.arange(0, CH)
    inb = offs < P
    ids = tl.load(ids_ptr + offs, mask=inb, other=-1)
    ok = inb & (ids >= 0) & (ids < E)
    return tl.histogram(tl.where(ok, ids, 0), EB, mask=ok)


@triton.jit
def align_hist_kernel(ids_ptr, hist_ptr, P, E, CH: tl.constexpr, EB: tl.constexpr):
    c = tl.program_id(0)
    h = _hist(ids_ptr, c * CH, P, E, CH, EB)
    tl.store(hist_ptr + c * EB + tl.arange(0, EB), h)


@triton.jit
def align_scatter_kernel(ids_ptr, hist_ptr, sorted_ptr, bexp_ptr, npad_ptr, P, E, n_chunks, cap, block_m,
                         BLOCK: tl.constexpr, CH: tl.constexpr, EB: tl.constexpr):
    e = tl.program_id(0)
    nprog = tl.num_programs(0)
    ce = tl.arange(0, EB)
    tot = tl.zeros((EB,), dtype=tl.int32)
    if n_chunks == 0:
        for start in range(0, P, CH):
            tot += _hist(ids_ptr, start, P, E, CH, EB)
    else:
        for c in range(0, n_chunks):
            tot += tl.load(hist_ptr + c * EB + ce)
    tot = tl.where(ce < E, tl.minimum(tl.maximum(tot, 0), P), 0)
    pc = (tot + block_m - 1) // block_m * block_m
    off = tl.sum(tl.where(ce < e, pc, 0), 0)
    cnt = tl.sum(tl.where(ce == e, tot, 0), 0)
    mine = tl.sum(tl.where(ce == e, pc, 0), 0)
    npad = tl.sum(pc, 0)
    ar = tl.arange(0, BLOCK)
    if cnt > 0:  # this expert's pairs, in pair order
        run = 0
        for start in range(0, P, BLOCK):
            offs = start + ar
            ids = tl.load(ids_ptr + offs, mask=offs < P, other=-1)
            hit = (offs < P) & (ids == e)
            pos = off + run + tl.cumsum(hit.to(tl.int32), 0) - 1
            tl.store(sorted_ptr + pos, offs, mask=hit & (pos >= 0) & (pos < cap))
            run += tl.sum(hit.to(tl.int32), 0)
    end = off + mine
    for q in range(off + cnt, end, BLOCK):  # this group's padding
        pos = q + ar
        tl.store(sorted_ptr + pos, tl.full((BLOCK,), 0, tl.int32) + P, mask=(pos < end) & (pos < cap))
    nb = cap // block_m
    bend = end // block_m
    for b0 in range(off // block_m, bend, BLOCK):  # this group's blocks
        b = b0 + ar
        tl.store(bexp_ptr + b, tl.full((BLOCK,), 0, tl.int32) + e, mask=(b < bend) & (b < nb))
    for q in range(npad + e * BLOCK, cap, nprog * BLOCK):  # the tail, shared by all programs
        pos = q + ar
        tl.store(sorted_ptr + pos, tl.full((BLOCK,), 0, tl.int32) + P, mask=pos < cap)
    for b0 in range(npad // block_m + e * BLOCK, nb, nprog * BLOCK):
        b = b0 + ar
        tl.store(bexp_ptr + b, tl.full((BLOCK,), -1, tl.int32), mask=b < nb)
    if e == 0:
        tl.store(npad_ptr, tl.minimum(npad, cap))
