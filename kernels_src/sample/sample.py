"""Token sampling over one row of logits per program (grid (B,)): penalties, temperature, min-p / top-k / top-p,
a seeded draw, optional log-probabilities; plus the per-slot token-count buffer the penalties read.

Per-row parameters are device arrays (one float32 row of NF = 8 and one int64 row of NI = 4 per batch row, layout
in runtime/vkc_runtime/ops/sample.py), so a captured graph replays with new values. Processed logits, per row:

    l_i = logits_i                                       (fp32; bf16 logits are widened)
    if the row has penalties (0 <= slot < num_slots and rep != 1 or pres != 0 or freq != 0):
        c = counts[slot, i];  n = c & COUNT_MASK (output count);  seen = c != 0 (prompt bit or n > 0)
        l_i = seen ? (l_i > 0 ? l_i / rep : l_i * rep) : l_i          (rep <= 0 counts as 1)
        l_i = l_i - freq * n - (n > 0 ? pres : 0)
    l_i = l_i / temperature                               (temperature > 0; else the row is greedy, no scaling)

Greedy rows (temperature <= 0 or NaN): token = argmax_i l_i, the lowest index among equal maxima.
Sampling rows draw from p_i = exp(l_i - m) / Z (m = max l, Z = sum exp(l - m)) restricted to the allowed set A,
with "joint" filters, each measured on that full distribution:

    i in A  <=>  count(l > l_i) < top_k   (top_k >= 1; 0 or negative: off)
            and  mass(l > l_i) < top_p * Z (top_p < 1; top_p <= 0 counts as the smallest positive p)
            and  l_i >= m + log(min_p)     (min_p > 0; min_p is clamped to <= 1)

A is an upper set of the values (it holds every token at least as large as any member; ties are all in or all
out) and always holds the maximum. Without filters a row takes 2 passes over V: the statistics (m, Z,
argmax, top-n) and an inverse-CDF scan with one uniform u (token = first i whose running sum of exp(l - m)
exceeds u * Z, in index order). With filters each draw is checked in one more pass (count and mass above
l_s); a rejected draw s moves the pivot to l_s -- every token <= l_s is outside A -- and the next draw is
from {l > pivot} with the mass the check just measured (rejection sampling: exactly p restricted to A).
The acceptance chance of a draw is at least mass(A) / mass(proposal), so a top-p row needs about 1/top_p
draws; after MAX_ROUNDS rejected draws the argmax is taken (it is in A).

Random numbers: u for draw r of a row = Philox(seed) at counter step * MAX_ROUNDS + r (tl.rand), with seed
and step the row's own: the same (seed, step, logits row, parameters) give the same token whatever the batch
around it. The caller advances step (e.g. the output position).

Top-n log-probabilities (n_top in 0..20, NTOP slots): the n largest l (ties: lower index first) and
log_softmax(l) = l - m - log Z of them (of the processed logits before the filters; greedy rows unscaled),
ids -1 and values -inf past the row's finite entries; the sampled token's log-probability likewise.

Row statistics in parallel (``sample_stats_kernel``, grid (B, n_slices)): program (row, j) computes pass 1's m,
Z and lowest argmax over slice [j * span, min((j + 1) * span, V)) of the processed logits and writes them to
``part[row, j]`` (fp32 m, fp32 Z relative to that m, the argmax's bits); the row program then merges the
n_slices partials in slice order (m = max m_j, Z = sum Z_j exp(m_j - m), the lowest argmax among the slices
reaching m: the same values as its own pass 1, Z up to fp32 summation order) instead of reading the row once
more on one SM -- a greedy row is then one parallel pass and a merge. n_slices 0 (no partials) or a row asking
for top-n log-probabilities runs the serial pass 1 as before. With the partials the later passes walk the row
slice by slice (``span`` logits each): the first draw (the full distribution) starts in the slice where the
running sum of the slices' exp-sums Z_j exp(m_j - m) passes u Z, its scan starting from the sum of the slices
before (the same token as a scan from 0 up to fp32 summation order); a redraw after a rejection skips every
slice whose max m_j is at most the pivot (no proposal token there) and a filter check every slice whose max is
at most the drawn logit (nothing above it there) -- exact, those slices add nothing to either sum.

Bounds: every load of the logits row is masked to [0, V) (a slice's to its end); a slot outside [0, num_slots)
reads no counts; the partials are read at [row, 0 .. n_slices) only, the host checks their buffer holds
B * n_slices * 4 floats and n_slices <= SMAX; the token written is clamped to [0, V - 1]; NaN logits give an
unspecified token inside that range.

counts_kernel: counts[slot, token] += 1 (outputs) or |= PROMPT_BIT (prompt) for each of n (token, slot)
pairs; pairs with a slot outside [0, num_slots) or a token outside [0, V) are skipped. reset_kernel zeroes
the rows of n slots (slots outside [0, num_slots) skipped).

Grids:
  sample_stats_kernel  (B, n_slices)
  sample_kernel  (B,)
  counts_kernel  (cdiv(n, BLOCK),)
  reset_kernel   (n, cdiv(V, BLOCK))
"""
import triton
import triton.language as tl

from kernels_src.common import pdl_enter

PROMPT_BIT = tl.constexpr(1 << 30)
COUNT_MASK = tl.constexpr((1 << 30) - 1)
BIG = tl.constexpr(2**31 - 1)


@triton.jit
def _raw(lrow, crow, offs, V, has_pen):
    """One block of a row's logits (as stored) and counts (0 without penalties); nothing is read past V."""
    inb = offs < V
    x = tl.load(lrow + offs, mask=inb, other=0.0)
    c = tl.zeros_like(offs)
    if has_pen:
        c = tl.load(crow + offs, mask=inb, other=0)
    return x, c


@triton.jit
def _apply(x, c, offs, V, has_pen, rep, pres, freq, scale_div):
    """The processed logits of a block from _raw (fp32, -inf past V)."""
    x = x.to(tl.float32)
    if has_pen:
        n = (c & COUNT_MASK).to(tl.float32)
        x = tl.where(c != 0, tl.where(x > 0, x / rep, x * rep), x)
        x = x - freq * n - tl.where(n > 0, pres, 0.0)
    x = x / scale_div
    return tl.where(offs < V, x, float("-inf"))


@triton.jit
def _processed(lrow, crow, offs, V, has_pen, rep, pres, freq, scale_div):
    x, c = _raw(lrow, crow, offs, V, has_pen)
    return _apply(x, c, offs, V, has_pen, rep, pres, freq, scale_div)


@triton.jit
def _row_params(fp_ptr, ip_ptr, counts_ptr, row, stride_c, num_slots, NF: tl.constexpr, NI: tl.constexpr):
    """A row's parameters: (temp, top_p, min_p, rep, pres, freq, top_k, seed, step, has_pen, count row, greedy,
    the temperature divisor)."""
    fp = fp_ptr + row * NF
    ip = ip_ptr + row * NI
    temp = tl.load(fp + 0)
    rep = tl.load(fp + 3)
    pres = tl.load(fp + 4)
    freq = tl.load(fp + 5)
    slot = tl.load(ip + 3)
    rep = tl.where(rep > 0, rep, 1.0)
    has_pen = (slot >= 0) & (slot < num_slots) & ((rep != 1.0) | (pres != 0.0) | (freq != 0.0))
    crow = counts_ptr + tl.where(has_pen, slot, 0).to(tl.int64) * stride_c
    greedy = ~(temp > 0.0)
    scale_div = tl.where(greedy, 1.0, temp)
    return (temp, tl.load(fp + 1), tl.load(fp + 2), rep, pres, freq, tl.load(ip + 0), tl.load(ip + 1),
            tl.load(ip + 2), has_pen, crow, greedy, scale_div)


@triton.jit
def _stats_block(m, z, am, x, offs, end):
    """Pass 1's update of (max, sum of exp(l - max), lowest argmax) by one block of processed logits."""
    bm = tl.max(x, 0)
    bi = tl.min(tl.where((x == bm) & (offs < end), offs, BIG), 0)
    am = tl.where(bm > m, bi, am)
    m_new = tl.maximum(m, bm)
    ms = tl.where(m_new == float("-inf"), 0.0, m_new)
    z = z * tl.exp(m - ms) + tl.sum(tl.exp(x - ms), 0)
    return m_new, z, am, bm


@triton.jit
def sample_stats_kernel(logits_ptr, fp_ptr, ip_ptr, counts_ptr, part_ptr, stride_l, V, stride_c, num_slots, span,
                        NF: tl.constexpr, NI: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Pass 1 of slice j of a row (module doc, "Row statistics in parallel"): part[row, j] = (m, Z, argmax)."""
    pdl_enter(PDL)
    row = tl.program_id(0)
    j = tl.program_id(1)
    (temp, top_p, min_p, rep, pres, freq, top_k, seed, step, has_pen, crow, greedy,
     scale_div) = _row_params(fp_ptr, ip_ptr, counts_ptr, row, stride_c, num_slots, NF, NI)
    lrow = logits_ptr + row.to(tl.int64) * stride_l
    ar = tl.arange(0, BLOCK)
    lo = j * span
    hi = tl.minimum(lo + span, V)
    m = float("-inf")
    z = 0.0
    am = 0
    xn, cn = _raw(lrow, crow, lo + ar, hi, has_pen)
    for start in range(lo, hi, BLOCK):
        offs = start + ar
        x = _apply(xn, cn, offs, hi, has_pen, rep, pres, freq, scale_div)
        xn, cn = _raw(lrow, crow, offs + BLOCK, hi, has_pen)  # prefetch (masked off past the slice)
        m, z, am, bm = _stats_block(m, z, am, x, offs, hi)
    base = part_ptr + (row.to(tl.int64) * tl.num_programs(1) + j) * 4
    tl.store(base, m)
    tl.store(base + 1, z)
    tl.store(base + 2, am.to(tl.int32).to(tl.float32, bitcast=True))


@triton.jit
def sample_kernel(logits_ptr, fp_ptr, ip_ptr, counts_ptr, tok_ptr, lp_ptr, topv_ptr, topi_ptr, part_ptr,
                  stride_l, V, stride_c, num_slots, n_top, stride_top, want_lp, n_slices, span,
                  NF: tl.constexpr, NI: tl.constexpr, BLOCK: tl.constexpr, NTOP: tl.constexpr,
                  MAX_ROUNDS: tl.constexpr, SMAX: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    row = tl.program_id(0)
    (temp, top_p, min_p, rep, pres, freq, top_k, seed, step, has_pen, crow, greedy,
     scale_div) = _row_params(fp_ptr, ip_ptr, counts_ptr, row, stride_c, num_slots, NF, NI)
    lrow = logits_ptr + row.to(tl.int64) * stride_l
    ar = tl.arange(0, BLOCK)

    # pass 1: max, lowest argmax, online sum of exp(l - m), top-n list -- or the merge of the slices' partials
    m = float("-inf")
    z = 0.0
    am = 0
    slots_t = tl.arange(0, NTOP)
    active = slots_t < n_top
    tv = tl.full((NTOP,), float("-inf"), tl.float32)
    ti = -1 - slots_t  # distinct placeholder ids (the highest is replaced first)
    worst = tl.min(tl.where(active, tv, float("inf")), 0)
    # the slices the later passes walk: the partials' slices when merged, else one slice [0, V) (max +inf: never
    # skipped); zc = each slice's exp-sum relative to the row max
    sliced = (n_slices > 0) & (n_top == 0)
    nsl = tl.where(sliced, n_slices, 1)
    sw = tl.where(sliced, span, V)
    js = tl.arange(0, SMAX)
    jm = js < nsl
    mj = tl.full((SMAX,), float("inf"), tl.float32)
    zc = tl.zeros((SMAX,), tl.float32)
    if sliced:
        pb = part_ptr + (row.to(tl.int64) * n_slices + js) * 4
        mj = tl.load(pb, mask=jm, other=float("-inf"))
        zj = tl.load(pb + 1, mask=jm, other=0.0)
        aj = tl.load(pb + 2, mask=jm, other=0.0).to(tl.int32, bitcast=True)
        m = tl.max(mj, 0)
        ms = tl.where(m == float("-inf"), 0.0, m)
        zc = tl.where(mj > float("-inf"), zj * tl.exp(mj - ms), 0.0)
        z = tl.sum(zc, 0)
        am = tl.min(tl.where(jm & (mj == m), aj, BIG), 0)
        am = tl.where(am == BIG, 0, am)
    else:
        xn, cn = _raw(lrow, crow, ar, V, has_pen)
        for start in range(0, V, BLOCK):
            offs = start + ar
            x = _apply(xn, cn, offs, V, has_pen, rep, pres, freq, scale_div)
            xn, cn = _raw(lrow, crow, offs + BLOCK, V, has_pen)  # prefetch (masked off past V)
            m, z, am, bm = _stats_block(m, z, am, x, offs, V)
            if (n_top > 0) & (bm > worst):
                xs = x
                for _t in range(0, n_top):
                    bmx = tl.max(xs, 0)
                    if bmx > worst:
                        bix = tl.min(tl.where(xs == bmx, offs, BIG), 0)
                        key = tl.where(active & (tv == worst), ti, -BIG)
                        sel = active & (ti == tl.max(key, 0)) & (tv == worst)
                        tv = tl.where(sel, bmx, tv)
                        ti = tl.where(sel, bix, ti)
                        xs = tl.where(offs == bix, float("-inf"), xs)
                        worst = tl.min(tl.where(active, tv, float("inf")), 0)
    am = tl.minimum(am, V - 1)
    ms = tl.where(m == float("-inf"), 0.0, m)
    log_z = ms + tl.log(z)

    if n_top > 0:  # the list, largest first (ties: lower id first), as log-probabilities
        tbase = row.to(tl.int64) * stride_top
        for j in range(0, n_top):
            vmax = tl.max(tl.where(active, tv, float("-inf")), 0)
            cand = active & (tv == vmax)
            imin = tl.min(tl.where(cand, ti, BIG), 0)
            pick = cand & (ti == imin)
            real = vmax > float("-inf")
            tl.store(topv_ptr + tbase + j, tl.where(real, vmax - log_z, float("-inf")))
            tl.store(topi_ptr + tbase + j, tl.where(real, imin, -1))
            active = active & ~pick

    tok = am
    sval = m
    if ~greedy:
        p_eff = tl.where(top_p > 0.0, top_p, 1e-30)
        filt_k = (top_k > 0) & (top_k < V)
        filt_p = top_p < 1.0
        filt_m = min_p > 0.0
        lminp = tl.where(filt_m, m + tl.log(tl.minimum(tl.maximum(min_p, 1e-30), 1.0)), float("-inf"))
        filt = filt_k | filt_p | filt_m
        pivot = float("-inf")
        zr = z
        done = 0
        for r in range(0, MAX_ROUNDS):
            if done == 0:
                u = tl.rand(seed, step * MAX_ROUNDS + r)
                target = u * zr
                c = 0.0
                found = 0
                s = -1
                last = -1
                j0 = 0
                if sliced & (pivot == float("-inf")):  # the full distribution: start in the slice u points into
                    j0 = tl.minimum(tl.min(tl.where(jm & (tl.cumsum(zc, 0) > target), js, SMAX), 0), nsl - 1)
                    c = tl.sum(tl.where(js < j0, zc, 0.0), 0)
                for j in range(j0, nsl):
                    # a slice whose max is <= the pivot holds no proposal token: skipped
                    if (found == 0) & (tl.max(tl.where(js == j, mj, float("-inf")), 0) > pivot):
                        lo = j * sw
                        hi = tl.minimum(lo + sw, V)
                        for start in range(lo, hi, BLOCK):
                            if found == 0:
                                offs = start + ar
                                x = _processed(lrow, crow, offs, hi, has_pen, rep, pres, freq, scale_div)
                                inp = x > pivot
                                e = tl.where(inp, tl.exp(x - ms), 0.0)
                                cs = tl.cumsum(e, 0) + c
                                hidx = tl.min(tl.where(inp & (cs > target), offs, BIG), 0)
                                last = tl.maximum(last, tl.max(tl.where(inp, offs, -1), 0))
                                if hidx < BIG:
                                    s = hidx
                                    found = 1
                                c = c + tl.sum(e, 0)
                if found == 0:  # rounding: target at or past the scan's total -> the last proposal token
                    s = last
                if s < 0:  # no proposal token at all (Z = 0 or NaN): the argmax
                    s = am
                # its processed logit (recomputed from the one element: same arithmetic as the passes)
                sv = tl.max(_processed(lrow, crow, s + ar, tl.minimum(s + 1, V), has_pen, rep, pres, freq,
                                       scale_div), 0)
                if filt:
                    cnt = 0
                    mass = 0.0
                    for j in range(0, nsl):
                        if tl.max(tl.where(js == j, mj, float("-inf")), 0) > sv:  # else nothing above sv in it
                            lo = j * sw
                            hi = tl.minimum(lo + sw, V)
                            xn, cn = _raw(lrow, crow, lo + ar, hi, has_pen)
                            for start in range(lo, hi, BLOCK):
                                offs = start + ar
                                x = _apply(xn, cn, offs, hi, has_pen, rep, pres, freq, scale_div)
                                xn, cn = _raw(lrow, crow, offs + BLOCK, hi, has_pen)
                                gt = x > sv
                                cnt = cnt + tl.sum(gt.to(tl.int32), 0)
                                mass = mass + tl.sum(tl.where(gt, tl.exp(x - ms), 0.0), 0)
                    ok = (~filt_k | (cnt < top_k)) & (~filt_p | (mass < p_eff * z)) & (sv >= lminp)
                    if ok:
                        tok = s
                        sval = sv
                        done = 1
                    else:
                        pivot = sv
                        zr = mass
                else:
                    tok = s
                    sval = sv
                    done = 1
    tok = tl.minimum(tl.maximum(tok, 0), V - 1)
    tl.store(tok_ptr + row, tok)
    if want_lp != 0:
        tl.store(lp_ptr + row, sval - log_z)


@triton.jit
def counts_kernel(counts_ptr, tok_ptr, slot_ptr, n, V, stride_c, num_slots, slot_off, slot_stride, prompt,
                  BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inb = i < n
    t = tl.load(tok_ptr + i, mask=inb, other=-1)
    s = tl.load(slot_ptr + slot_off + i.to(tl.int64) * slot_stride, mask=inb, other=-1)
    ok = inb & (t >= 0) & (t < V) & (s >= 0) & (s < num_slots)
    p = counts_ptr + tl.where(ok, s, 0).to(tl.int64) * stride_c + tl.where(ok, t, 0)
    if prompt != 0:
        tl.atomic_or(p, tl.full((BLOCK,), PROMPT_BIT, tl.int32), mask=ok)
    else:
        tl.atomic_add(p, tl.full((BLOCK,), 1, tl.int32), mask=ok)


@triton.jit
def reset_kernel(counts_ptr, slot_ptr, V, stride_c, num_slots, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_enter(PDL)
    s = tl.load(slot_ptr + tl.program_id(0))
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = (s >= 0) & (s < num_slots)
    row = counts_ptr + tl.where(ok, s, 0).to(tl.int64) * stride_c
    tl.store(row + cols, tl.zeros((BLOCK,), tl.int32), mask=(cols < V) & ok)
