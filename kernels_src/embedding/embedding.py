"""Token embedding gather. Grid (T, cdiv(N, BLOCK)): axis 0 = token, axis 1 = column block."""
import triton
import triton.language as tl

from kernels_src.common import floor16, pdl_enter


@triton.jit
def _embedding_block(src_row, out_row, valid, N, BLOCK: tl.constexpr):
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    # an invalid id reads nothing: its load bound is 0 (a select keeps N's divisibility for vectorizing)
    v = tl.load(src_row + cols, mask=cols < tl.where(valid, N, 0), other=0.0)
    tl.store(out_row + cols, v, mask=cols < N)


@triton.jit
def embedding_kernel(ids_ptr, table_ptr, out_ptr, stride_table, stride_out, V, N, BLOCK: tl.constexpr,
                     PDL: tl.constexpr):
    """out[t, :N] = table[ids[t], :N], or zeros when ids[t] is outside [0, V) (nothing is read then)."""
    pdl_enter(PDL)
    t = tl.program_id(0).to(tl.int64)
    tok = tl.load(ids_ptr + t)
    valid = (tok >= 0) & (tok < V)
    src_row = table_ptr + tl.where(valid, tok, 0).to(tl.int64) * stride_table
    out_row = out_ptr + t * stride_out
    if N % 16 == 0:
        _embedding_block(src_row, out_row, valid, floor16(N), BLOCK)
    else:
        _embedding_block(src_row, out_row, valid, N, BLOCK)
