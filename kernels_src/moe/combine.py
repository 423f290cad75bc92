"""The weighted sum of the expert outputs per token: ``out[m] = sum_j w[m, j] * y[m * k' + j]`` over the j
whose id is in [0, E') (an invalid id's row was never written by the GEMMs: it is not read), fp32 in fixed
j order (deterministic), bf16 out. has_w == 0: the weights were applied already (the sum is unweighted).

Grid (M, cdiv(H, BH)); ids int32 / weights fp32 [M, k'] contiguous; y [P, H] and out [M, H] bf16 with row
strides. Bounds: columns past H masked; rows read only for valid ids, at f < M * k'.
"""
import triton
import triton.language as tl


@triton.jit
def combine_kernel(y_ptr, ids_ptr, w_ptr, out_ptr, H, k_out, E, stride_y, stride_o, has_w, BH: tl.constexpr):
    m = tl.program_id(0)
    cols = tl.program_id(1) * BH + tl.arange(0, BH)
    cm = cols < H
    acc = tl.zeros((BH,), dtype=tl.float32)
    for j in range(0, k_out):
        f = m.to(tl.int64) * k_out + j
        e = tl.load(ids_ptr + f)
        wt = 1.0
        if has_w != 0:
            wt = tl.load(w_ptr + f)
        if (e >= 0) & (e < E):
            y = tl.load(y_ptr + f * stride_y + cols, mask=cm, other=0.0).to(tl.float32)
            acc += wt * y
    tl.store(out_ptr + m.to(tl.int64) * stride_o + cols, acc.to(tl.bfloat16), mask=cm)
