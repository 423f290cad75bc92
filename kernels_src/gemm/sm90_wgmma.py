"""sm_90a BF16 and FP8 GEMMs with TMA loads, WGMMA and a TMA-store epilogue (CuTe DSL).

    C[M, N] = A[M, K] @ W[N, K]^T                           Sm90BF16Gemm: A, W, C bf16 row-major; fp32 accumulation
    C[M, N] = (A[M, K] @ W[N, K]^T) * sa[m * sa_step] * sw[n * sw_step]
                                                            Sm90FP8Gemm: A, W fp8 e4m3, C bf16, sa / sw fp32 scales
                                                            (per tensor: step 0; per token / per channel: step >= 1)
    C[M, N] = sum_kt (A[:, kt] @ W[:, kt]^T) * sa[m, kt] * sw[n // 128, kt]
                                                            Sm90FP8BlockGemm: block-scaled FP8 (128-wide k-slices kt,
                                                            128 x 128 weight blocks), each slice promoted

W is [N, K] as Hugging Face stores a Linear weight, so both operands are K-major and feed WGMMA straight from
shared memory. M, N, K and the three row strides are runtime values (one compiled kernel per tile
configuration); the host guarantees K, N and the strides are multiples of 8 elements (16-byte TMA row pitch) and
K >= 8 (FP8: K and the A / W row strides multiples of 16 elements). The tensor-memory accelerator clips every load
and store to the tensor bounds (zero-filled loads past M, N or K, no stores past M or N), so any such shape is safe
and a partial last k-slice adds zeros.

CTA organisation (persistent: the grid is min(tiles, ``ctas``), where the launcher passes the device's SM count as
``ctas`` (one CTA per SM fits); CTA b computes output tiles b, b + grid, b + 2 grid, ..., so no SM count is baked
into the kernel):

* warp group 0 is the loader: its first warp issues the TMA loads of A and W k-slices, tile after tile, into a
  ring of ``stages`` shared-memory buffers, so the next tile's first slices arrive while the math warp groups
  finish the current one; the warp group gives most of its registers to the others (setmaxnreg);
* warp groups 1..n are the math warp groups (n = tile_m / 64: two, or three for the block-scaled 192-row tile):
  each owns 64 rows of the tile, waits for a stage, issues the WGMMAs of that stage, keeps one batch of WGMMAs in
  flight and hands the stage before it back to the loader; after the k loop they convert the fp32 accumulators to
  bf16 in chunks (stmatrix into a small staging ring in shared memory) that one warp stores to global memory with
  TMA. The FP8 kernel first multiplies each accumulator by the scales of its row and column (row / column clamped
  to M - 1 / N - 1, so every scale read is inside the scale vectors; rows and columns past M / N are never
  stored).

Tiles are visited in groups of ``group_m`` tile rows (all tile columns of a group before the next group) so the
A rows and W columns that a wave of CTAs reads stay in L2.
"""
from __future__ import annotations

from typing import NamedTuple

import cuda.bindings.driver as cuda

import cutlass
import cutlass.cute as cute
import cutlass.pipeline as pipeline
import cutlass.utils as utils
import cutlass.utils.hopper_helpers as sm90
from cutlass.cute.nvgpu import cpasync, warpgroup

WARP_GROUP = 128           # threads in a warp group
EPI_BARRIER_ID = 1         # named barrier among the math threads (0 is __syncthreads)
SMEM_ALIGN = 1024          # 128B-swizzled tiles want 1 KiB-aligned buffers
SCALE_BLOCK = 128          # block-scaled FP8: one scale per 128 x 128 weight block and per 1 x 128 activations


class _Tile(NamedTuple):
    tile_m: int
    tile_n: int
    stages: int
    epi_stages: int
    group_m: int


def _issue(mma, part, frag_a, frag_w, stage):
    """The WGMMAs of one k-slice (shared-memory stage ``stage``) into a fresh partial product ``part``, committed
    as one group (block-scaled FP8; traced inline). Returns ``mma``: its ACCUMULATE field changes here, and the
    caller rebinds it so that the tracer carries it through the staged loop."""
    warpgroup.fence()
    for kb in range(cute.size(frag_a, mode=[2])):  # a plain (trace-time) loop: this helper is not preprocessed
        mma.set(warpgroup.Field.ACCUMULATE, kb != 0)
        cute.gemm(mma, part, frag_a[(None, None, kb, stage)], frag_w[(None, None, kb, stage)], part)
    warpgroup.commit_group()
    return mma


def _accumulate(mma, acc, frag_a, frag_w, stage):
    """The WGMMAs of one k-slice (shared-memory stage ``stage``) accumulated into ``acc`` (ACCUMULATE set), committed
    as one group (bf16 / FP8; traced inline)."""
    warpgroup.fence()
    for kb in range(cute.size(frag_a, mode=[2])):  # a plain (trace-time) loop: this helper is not preprocessed
        cute.gemm(mma, acc, frag_a[(None, None, kb, stage)], frag_w[(None, None, kb, stage)], acc)
    warpgroup.commit_group()


def _promote(acc, part, a_lo, a_hi, s_w):
    """acc += part * (sa * sw): a thread's accumulators lie on two rows, 8 apart (the WGMMA f32 accumulator layout:
    value i is on the second row when bit 1 of i is set), with activation scales a_lo / a_hi."""
    s_lo = a_lo * s_w
    s_hi = a_hi * s_w
    for i in range(cute.size(acc)):
        acc[i] = acc[i] + part[i] * (s_hi if (i // 2) % 2 else s_lo)


def _block_slice(ring, take, give, mma, part_new, part_done, acc, frag_a, frag_w, a_lo, a_hi, s_w):
    """One k-slice of the block-scaled loop (traced inline): wait for stage ``take``, issue its WGMMAs into
    ``part_new``, wait until only they still run, hand the previous slice's stage back and promote that slice's
    ``part_done``. Returns the advanced pipeline states and ``mma`` for the caller to rebind (the loop carries
    them)."""
    ring.consumer_wait(take)
    mma = _issue(mma, part_new, frag_a, frag_w, take.index)
    take.advance()
    warpgroup.wait_group(1)
    ring.consumer_release(give)
    give.advance()
    _promote(acc, part_done, a_lo, a_hi, s_w)
    return take, give, mma


def _block_last(ring, give, acc, part, a_lo, a_hi, s_w):
    """The block-scaled loop's drain (traced inline): wait for the last slice, hand its stage back, promote it.
    Returns the advanced release state."""
    warpgroup.wait_group(0)
    ring.consumer_release(give)
    give.advance()
    _promote(acc, part, a_lo, a_hi, s_w)
    return give


class Sm90BF16Gemm:
    """Callable with ``(a, w, c, stream)``; pass it to ``cute.compile`` with fake tensors."""

    TILE_K = 64  # one 128-byte swizzle row of bf16 per k-slice
    SCALED = False  # the FP8 subclass scales the accumulators in the epilogue
    BLOCK_SCALED = False  # the block-scaled FP8 subclass promotes each k-slice's product with its scales
    # registers per thread (setmaxnreg) kept by the loader warp group / granted to each math warp group:
    # 40 + 2 x 232 (x 128 threads) fills the register file
    REGS = (40, 232)

    @staticmethod
    def operand_type():
        return cutlass.BFloat16

    TILE_MS = (128,)  # tile rows: 64 per math warp group

    def __init__(self, *, tile_m: int, tile_n: int, stages: int, epi_stages: int, group_m: int):
        """The keyword arguments are a spec's ``config`` (kernels_src/gemm/spec.py)."""
        if tile_m not in self.TILE_MS:
            raise ValueError(f"tile_m must be one of {self.TILE_MS} (64 rows per math warp group)")
        if tile_n not in (64, 128, 256):
            raise ValueError("tile_n must be 64, 128 or 256")
        if stages < 2 or epi_stages < 1 or group_m < 1:
            raise ValueError("need stages >= 2, epi_stages >= 1, group_m >= 1")
        self.cfg = _Tile(tile_m, tile_n, stages, epi_stages, group_m)
        self.n_math_wg = tile_m // 64
        self.threads = WARP_GROUP * (1 + self.n_math_wg)
        self.math_threads = WARP_GROUP * self.n_math_wg
        self.tile = (tile_m, tile_n, self.TILE_K)

    # ---------------------------------------------------------------- host side (traced once per tile configuration)
    @cute.jit
    def __call__(self, a: cute.Tensor, w: cute.Tensor, c: cute.Tensor, ctas: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, w, c, c, c, ctas, stream)  # no scales: c stands in for them (never read)

    @cute.jit
    def _launch(self, a: cute.Tensor, w: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor, scale_w: cute.Tensor,
                ctas: cutlass.Int32, stream: cuda.CUstream):
        """The host-side body of ``__call__`` (traced inside it): layouts, TMA atoms, the launch."""
        cfg = self.cfg
        ab_t = self.operand_type()
        c_t = cutlass.BFloat16
        a_major = utils.LayoutEnum.from_tensor(a)
        w_major = utils.LayoutEnum.from_tensor(w)
        c_major = utils.LayoutEnum.from_tensor(c)

        mma = sm90.make_trivial_tiled_mma(
            ab_t, ab_t, a_major.sm90_mma_major_mode(), w_major.sm90_mma_major_mode(),
            cutlass.Float32, (self.n_math_wg, 1, 1), tiler_mn=(64, cfg.tile_n))

        a_ring = sm90.make_smem_layout_a(a_major, self.tile, ab_t, cfg.stages)
        w_ring = sm90.make_smem_layout_b(w_major, self.tile, ab_t, cfg.stages)
        epi_tile = sm90.compute_tile_shape_or_override(
            self.tile, c_t, is_cooperative=True, epi_tile_override=None if cfg.tile_m == 128 else (cfg.tile_m, 32))
        c_ring = sm90.make_smem_layout_epi(c_t, c_major, epi_tile, cfg.epi_stages)

        one_a = cute.slice_(a_ring, (None, None, 0))
        one_w = cute.slice_(w_ring, (None, None, 0))
        load_a, tma_a = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), a, one_a, (cfg.tile_m, self.TILE_K))
        load_w, tma_w = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileG2SOp(), w, one_w, (cfg.tile_n, self.TILE_K))
        store_c, tma_c = cpasync.make_tiled_tma_atom(
            cpasync.CopyBulkTensorTileS2GOp(), c, cute.slice_(c_ring, (None, None, 0)), epi_tile)
        stage_bytes = cute.size_in_bytes(ab_t, one_a) + cute.size_in_bytes(ab_t, one_w)

        @cute.struct
        class Smem:
            bars: cute.struct.MemRange[cutlass.Int64, cfg.stages * 2]
            sa: cute.struct.Align[cute.struct.MemRange[ab_t, cute.cosize(a_ring)], SMEM_ALIGN]
            sw: cute.struct.Align[cute.struct.MemRange[ab_t, cute.cosize(w_ring)], SMEM_ALIGN]
            sc: cute.struct.Align[cute.struct.MemRange[c_t, cute.cosize(c_ring)], SMEM_ALIGN]

        # a tile's epilogue chunks start again at staging slot 0: the slots must come round exactly once a tile
        chunks = (cfg.tile_m // cute.size(epi_tile[0])) * (cfg.tile_n // cute.size(epi_tile[1]))
        if cutlass.const_expr(chunks % cfg.epi_stages != 0):
            raise ValueError(f"epi_stages={cfg.epi_stages} must divide a tile's {chunks} epilogue chunks")

        self.smem_struct = Smem
        self.stage_bytes = stage_bytes
        self.epi_tile = epi_tile

        m_tiles = (c.shape[0] + cfg.tile_m - 1) // cfg.tile_m
        n_tiles = (c.shape[1] + cfg.tile_n - 1) // cfg.tile_n
        self.device(load_a, tma_a, load_w, tma_w, store_c, tma_c, mma, a_ring, w_ring, c_ring, scale_a, scale_w).launch(
            grid=(cutlass.min(m_tiles * n_tiles, ctas), 1, 1), block=(self.threads, 1, 1), stream=stream)

    # ---------------------------------------------------------------- device side
    @cute.kernel
    def device(self, load_a: cute.CopyAtom, tma_a: cute.Tensor, load_w: cute.CopyAtom, tma_w: cute.Tensor,
               store_c: cute.CopyAtom, tma_c: cute.Tensor, mma: cute.TiledMma,
               a_ring: cute.ComposedLayout, w_ring: cute.ComposedLayout, c_ring: cute.ComposedLayout,
               scale_a: cute.Tensor, scale_w: cute.Tensor):
        cfg = self.cfg
        tidx, _, _ = cute.arch.thread_idx()
        bid, _, _ = cute.arch.block_idx()
        ctas, _, _ = cute.arch.grid_dim()
        warp = cute.arch.make_warp_uniform(cute.arch.warp_idx())
        wg = cute.arch.make_warp_uniform(tidx // WARP_GROUP)

        if warp == 0:
            cpasync.prefetch_descriptor(load_a)
            cpasync.prefetch_descriptor(load_w)
            cpasync.prefetch_descriptor(store_c)

        n_tiles = (tma_c.shape[1] + cfg.tile_n - 1) // cfg.tile_n
        m_tiles = (tma_c.shape[0] + cfg.tile_m - 1) // cfg.tile_m
        tiles = m_tiles * n_tiles

        # ---- shared memory and the load ring's barriers
        smem = utils.SmemAllocator().allocate(self.smem_struct)
        ring = pipeline.PipelineTmaAsync.create(
            barrier_storage=smem.bars.data_ptr(),
            num_stages=cfg.stages,
            producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread),
            # every math warp hands a stage back once
            consumer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.math_threads // 32),
            tx_count=self.stage_bytes,
            cta_layout_vmnk=cute.make_layout((1, 1, 1, 1)),
        )
        sa = smem.sa.get_tensor(a_ring.outer, swizzle=a_ring.inner)
        sw = smem.sw.get_tensor(w_ring.outer, swizzle=w_ring.inner)
        sc = smem.sc.get_tensor(c_ring.outer, swizzle=c_ring.inner)

        # ---- the global (TMA coordinate) tensors cut into tiles; a tile's coordinates pick one below
        ga = cute.local_tile(tma_a, self.tile, (None, None, None), proj=(1, None, 1))   # (tm, tk, m_tiles, k_tiles)
        gw = cute.local_tile(tma_w, self.tile, (None, None, None), proj=(None, 1, 1))   # (tn, tk, n_tiles, k_tiles)
        gc = cute.local_tile(tma_c, self.tile, (None, None, None), proj=(1, 1, None))   # (tm, tn, m_tiles, n_tiles)
        k_tiles = cute.size(ga, mode=[3])

        if wg == 0:
            # ================= loader warp group: every k-slice of every tile of this CTA, in order
            cute.arch.setmaxregister_decrease(self.regs()[0])
            if warp == 0:
                a_dst, a_src = cpasync.tma_partition(
                    load_a, 0, cute.make_layout(1), cute.group_modes(sa, 0, 2), cute.group_modes(ga, 0, 2))
                w_dst, w_src = cpasync.tma_partition(
                    load_w, 0, cute.make_layout(1), cute.group_modes(sw, 0, 2), cute.group_modes(gw, 0, 2))
                put = pipeline.make_pipeline_state(pipeline.PipelineUserType.Producer, cfg.stages)
                for t in cutlass.range(bid, tiles, ctas, unroll=1):
                    tile_m_idx, tile_n_idx = self._tile_coords(t, m_tiles, n_tiles)
                    for kt in cutlass.range(k_tiles, unroll=1):
                        ring.producer_acquire(put)
                        full = ring.producer_get_barrier(put)
                        cute.copy(load_a, a_src[(None, tile_m_idx, kt)], a_dst[(None, put.index)], tma_bar_ptr=full)
                        cute.copy(load_w, w_src[(None, tile_n_idx, kt)], w_dst[(None, put.index)], tma_bar_ptr=full)
                        ring.producer_commit(put)
                        put.advance()
                ring.producer_tail(put)
        else:
            # ================= math warp groups: one tile at a time, the epilogue of each before the next
            cute.arch.setmaxregister_increase(self.regs()[1])
            mtid = tidx - WARP_GROUP
            my_mma = mma.get_slice((wg - 1) * WARP_GROUP)
            frag_a = mma.make_fragment_A(my_mma.partition_A(sa))
            frag_w = mma.make_fragment_B(my_mma.partition_B(sw))
            one_c = gc[(None, None, 0, 0)]
            acc = cute.make_rmem_tensor(my_mma.partition_C(one_c).shape, cutlass.Float32)
            coords = mma.get_slice(mtid).partition_C(cute.make_identity_tensor((cfg.tile_m, cfg.tile_n)))
            m_last = tma_c.shape[0] - 1
            n_last = tma_c.shape[1] - 1

            if cutlass.const_expr(self.BLOCK_SCALED):
                parts = tuple(cute.make_rmem_tensor(acc.shape, cutlass.Float32) for _ in range(self.block_parts()))
            take = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)
            give = pipeline.make_pipeline_state(pipeline.PipelineUserType.Consumer, cfg.stages)

            # ---- the epilogue's fixed parts: fp32 accumulators -> bf16 -> staging ring (stmatrix) -> global (TMA)
            c_major = utils.LayoutEnum.ROW_MAJOR
            r2s = cute.make_tiled_copy_S(
                sm90.sm90_get_smem_store_op(c_major, elem_ty_d=cutlass.BFloat16, elem_ty_acc=cutlass.Float32),
                cute.make_tiled_copy_C_atom(
                    cute.make_copy_atom(cute.nvgpu.warp.StMatrix8x8x16bOp(False, 4), cutlass.BFloat16), mma))
            my_r2s = r2s.get_slice(mtid)
            stage_dst = my_r2s.partition_D(sc)                  # (R2S, R2S_M, R2S_N, epi_stage)
            acc_view = r2s.retile(acc)
            crd_view = r2s.retile(coords)  # each accumulator's (row, column) in the tile, in acc_view's order
            chunk_shape = cute.shape(my_r2s.partition_S(sc))[:3]
            chunk_f32 = cute.make_rmem_tensor(chunk_shape, cutlass.Float32)
            chunk_bf16 = cute.make_rmem_tensor(chunk_shape, cutlass.BFloat16)
            chunk_len = cute.size(chunk_f32)
            one_chunks = cute.zipped_divide(one_c, self.epi_tile)
            chunk_grid = one_chunks.shape[1]
            chunk_order = cute.make_layout(chunk_grid, stride=(chunk_grid[1], 1))
            n_chunks = cute.size(one_chunks, mode=[1])
            math_sync = pipeline.NamedBarrier(barrier_id=EPI_BARRIER_ID, num_threads=self.math_threads)
            stores = pipeline.PipelineTmaStore.create(
                num_stages=cfg.epi_stages,
                producer_group=pipeline.CooperativeGroup(pipeline.Agent.Thread, self.math_threads))
            storer = warp == WARP_GROUP // 32  # first warp of the first math warp group

            for t in cutlass.range(bid, tiles, ctas, unroll=1):
                tile_m_idx, tile_n_idx = self._tile_coords(t, m_tiles, n_tiles)
                acc.fill(0.0)
                if cutlass.const_expr(self.BLOCK_SCALED):
                    # one k-slice is one 128-wide scale block: its WGMMAs start a fresh fp32 partial product
                    # (parts), which is then promoted, acc += part * (sa[row, kt] * sw[n block, kt]).
                    # the two rows of this thread's accumulators (_promote); rows past M read row M - 1's scales
                    # (never stored)
                    row_lo = cutlass.min(tile_m_idx * cfg.tile_m + coords[0][0], m_last)
                    row_hi = cutlass.min(tile_m_idx * cfg.tile_m + coords[2][0], m_last)
                    n_blk = cutlass.min(tile_n_idx * cfg.tile_n // SCALE_BLOCK, scale_w.shape[0] - 1)
                    if cutlass.const_expr(len(parts) == 1):
                        # one partial product per warp group: issue a slice, wait for it, promote it; the other
                        # warp groups' WGMMAs keep the tensor cores busy meanwhile (the warp groups are not put in
                        # turn: issuing in named-barrier order measured 3% slower on the H100, session 32). The
                        # slice's scales are loaded before its WGMMAs are issued; this tile's scale rows are 1-D
                        # views (a slice's loads: one offset from three bases).
                        sa_lo = scale_a[(row_lo, None)]
                        sa_hi = scale_a[(row_hi, None)]
                        sw_blk = scale_w[(n_blk, None)]
                        for kt in cutlass.range(k_tiles, unroll=1):
                            lo0 = sa_lo[kt]
                            hi0 = sa_hi[kt]
                            w0 = sw_blk[kt]
                            ring.consumer_wait(take)
                            mma = _issue(mma, parts[0], frag_a, frag_w, take.index)
                            take.advance()
                            give = _block_last(ring, give, acc, parts[0], lo0, hi0, w0)
                    else:
                        # two partial products in turn: slice kt + 1's WGMMAs run while slice kt is promoted; each
                        # slice's scales are loaded when its WGMMAs are issued, a slice before they are used
                        lo0 = scale_a[row_lo, 0]
                        hi0 = scale_a[row_hi, 0]
                        w0 = scale_w[n_blk, 0]
                        ring.consumer_wait(take)
                        mma = _issue(mma, parts[0], frag_a, frag_w, take.index)
                        take.advance()
                        lo1, hi1, w1 = lo0, hi0, w0
                        for j in cutlass.range((k_tiles - 1) // 2, unroll=1):
                            lo1 = scale_a[row_lo, 2 * j + 1]
                            hi1 = scale_a[row_hi, 2 * j + 1]
                            w1 = scale_w[n_blk, 2 * j + 1]
                            take, give, mma = _block_slice(ring, take, give, mma, parts[1], parts[0], acc, frag_a,
                                                           frag_w, lo0, hi0, w0)
                            lo0 = scale_a[row_lo, 2 * j + 2]
                            hi0 = scale_a[row_hi, 2 * j + 2]
                            w0 = scale_w[n_blk, 2 * j + 2]
                            take, give, mma = _block_slice(ring, take, give, mma, parts[0], parts[1], acc, frag_a,
                                                           frag_w, lo1, hi1, w1)
                        if (k_tiles - 1) % 2 == 1:
                            lo1 = scale_a[row_lo, k_tiles - 1]
                            hi1 = scale_a[row_hi, k_tiles - 1]
                            w1 = scale_w[n_blk, k_tiles - 1]
                            take, give, mma = _block_slice(ring, take, give, mma, parts[1], parts[0], acc, frag_a,
                                                           frag_w, lo0, hi0, w0)
                            give = _block_last(ring, give, acc, parts[1], lo1, hi1, w1)
                        else:
                            give = _block_last(ring, give, acc, parts[0], lo0, hi0, w0)
                else:
                    # accumulate into the zeroed tile (the TiledMma's ACCUMULATE field starts cleared); the tile's
                    # first k-slice has no predecessor to hand back
                    mma.set(warpgroup.Field.ACCUMULATE, True)
                    ring.consumer_wait(take)
                    _accumulate(mma, acc, frag_a, frag_w, take.index)
                    take.advance()

                    for _ in cutlass.range(1, k_tiles, unroll=1):
                        ring.consumer_wait(take)
                        _accumulate(mma, acc, frag_a, frag_w, take.index)
                        # at most this slice's WGMMAs still run: the previous slice's buffers are free
                        warpgroup.wait_group(1)
                        ring.consumer_release(give)
                        give.advance()
                        take.advance()
                    warpgroup.wait_group(0)
                    ring.consumer_release(give)
                    give.advance()

                # ---- epilogue of this tile (the loader is already filling the ring with the next tile's slices)
                gc_chunks = cute.zipped_divide(gc[(None, None, tile_m_idx, tile_n_idx)], self.epi_tile)
                c_src, c_dst = cpasync.tma_partition(
                    store_c, 0, cute.make_layout(1), cute.group_modes(sc, 0, 2), gc_chunks)
                if cutlass.const_expr(self.SCALED):
                    # the FP8 kernel's scales, acc * sa[row] * sw[col], applied chunk by chunk (a few scale loads
                    # live at a time); rows / columns clamped to M - 1 / N - 1, never stored past them
                    m0 = tile_m_idx * cfg.tile_m
                    n0 = tile_n_idx * cfg.tile_n
                for ci in cutlass.range_constexpr(n_chunks):
                    for v in cutlass.range_constexpr(chunk_len):
                        if cutlass.const_expr(self.SCALED):
                            crd = crd_view[ci * chunk_len + v]
                            row = cutlass.min(m0 + crd[0], m_last)
                            col = cutlass.min(n0 + crd[1], n_last)
                            chunk_f32[v] = acc_view[ci * chunk_len + v] * (scale_a[row] * scale_w[col])
                        else:
                            chunk_f32[v] = acc_view[ci * chunk_len + v]
                    chunk_bf16.store(chunk_f32.load().to(cutlass.BFloat16))
                    slot = ci % cfg.epi_stages
                    cute.copy(r2s, chunk_bf16, stage_dst[(None, None, None, slot)])
                    # make the generic-proxy smem writes visible to the TMA (async proxy), then gather the threads
                    cute.arch.fence_proxy("async.shared", space="cta")
                    math_sync.arrive_and_wait()
                    if storer:
                        cute.copy(store_c, c_src[(None, slot)], c_dst[(None, chunk_order.get_hier_coord(ci))])
                        stores.producer_commit()
                        stores.producer_acquire()   # the slot reused next (this tile's or the next one's) is free
                    math_sync.arrive_and_wait()
            if storer:
                stores.producer_tail()

    def regs(self):
        """(loader, math) registers per thread for this warp-group count."""
        return self.REGS

    def _tile_coords(self, t, m_tiles, n_tiles):
        """Output tile ``t`` -> (tile row, tile column), visited in groups of ``group_m`` tile rows: all tile
        columns of a group before the next group, so a wave's A rows and W columns stay in L2 (traced inline)."""
        per_group = self.cfg.group_m * n_tiles
        group = t // per_group
        first_m = group * self.cfg.group_m
        rows_here = cutlass.min(m_tiles - first_m, self.cfg.group_m)
        in_group = t - group * per_group
        return first_m + in_group % rows_here, in_group // rows_here


class Sm90FP8Gemm(Sm90BF16Gemm):
    """FP8 e4m3 operands (both K-major, as WGMMA needs for 8-bit types), bf16 out, scales in the epilogue.
    Callable with ``(a, w, c, sa, sw, stream)``: sa [M] fp32 (element stride sa_step, 0 = one scale), sw [N] fp32."""

    TILE_K = 128  # one 128-byte swizzle row of fp8 per k-slice
    SCALED = True

    @staticmethod
    def operand_type():
        return cutlass.Float8E4M3FN

    @cute.jit
    def __call__(self, a: cute.Tensor, w: cute.Tensor, c: cute.Tensor, scale_a: cute.Tensor, scale_w: cute.Tensor,
                 ctas: cutlass.Int32, stream: cuda.CUstream):
        self._launch(a, w, c, scale_a, scale_w, ctas, stream)


class Sm90FP8BlockGemm(Sm90FP8Gemm):
    """Block-scaled FP8 e4m3 (Qwen's FP8 checkpoints): C = sum_kt (A[:, kt] @ W[:, kt]^T) * sa[m, kt] *
    sw[n // 128, kt] over the 128-wide k-slices kt. Callable with ``(a, w, c, sa, sw, stream)``: sa [M, cdiv(K,
    128)] and sw [cdiv(N, 128), cdiv(K, 128)] fp32, row-major with runtime row strides. A k-slice is exactly one
    scale block, so each slice's WGMMAs accumulate into a fresh fp32 partial product that is scaled into the
    accumulators (the promotion of the Triton kernel ``gemm_fp8_block_kernel``, same rounding order; it also keeps
    Hopper's FP8 WGMMA accumulation, which holds fewer bits than fp32, to 128 products). Two partial products are
    used in turn, so that a slice's WGMMAs run while the previous slice is promoted (H200: 1.05-1.3x the one-buffer
    form). Tiles are 128 rows by 64 or 128 columns (one weight-scale block per tile; three fp32 tiles of registers
    per thread: no 256-column tile), or 192 x 128 with three math warp groups and one partial product each: while
    one warp group promotes, the other two keep the tensor cores busy (H100, session 32: 0.89x the time of the
    128 x 128 tile over the benchmark's shapes, picked per shape)."""

    SCALED = False
    BLOCK_SCALED = True
    # H100, persistent: t128x128 0.93-1.03x of one CTA per tile with 24 + 2 x 240, 0.87-0.96x with 40 + 2 x 232
    # (BENCHMARKS.md, session 30)
    REGS = (24, 240)

    TILE_MS = (128, 192)

    def regs(self):
        # three math warp groups (tile_m 192): 24 + 3 x 160 of the 512 registers-per-thread budget
        return self.REGS if self.n_math_wg == 2 else (24, 160)

    def block_parts(self):
        """Partial-product buffers per warp group: two in turn with two math warp groups, one with three."""
        return 2 if self.n_math_wg == 2 else 1

    def __init__(self, **config):
        super().__init__(**config)
        if self.cfg.tile_n not in (64, 128):
            raise ValueError("block-scaled tiles are 64 or 128 columns wide (one weight-scale block per tile)")
