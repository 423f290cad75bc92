"""@triton.jit helpers shared by the attention kernels."""
import triton
import triton.language as tl


@triton.jit
def kv_rows(bt_row, offs_n, kvh, n_valid, block_size, max_blocks, num_blocks, stride_cb, stride_cs, stride_ch):
    """Element offsets (int64) of the cache rows of absolute key positions ``offs_n`` of one sequence.

    Logical block ``n // block_size`` is looked up in the sequence's block-table row. Keys at or past
    ``n_valid``, or whose physical block id lies outside [0, num_blocks), are reported invalid and point at
    row 0 of block 0 (so nothing outside the cache is ever addressed)."""
    lb = offs_n // block_size
    inb = (offs_n < n_valid) & (lb < max_blocks)
    blk = tl.load(bt_row + lb, mask=inb, other=0)
    ok = inb & (blk >= 0) & (blk < num_blocks)
    blk = tl.where(ok, blk, 0).to(tl.int64)
    sl = tl.where(ok, offs_n % block_size, 0).to(tl.int64)
    return blk * stride_cb + sl * stride_cs + kvh * stride_ch, ok
