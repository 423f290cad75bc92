"""Small @triton.jit helpers shared by several kernel families (fp32 in, fp32 out)."""
import triton
import triton.language as tl
try:
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # a Triton without grid dependency control (JIT explorations only): PDL=False everywhere
    gdc_launch_dependents = gdc_wait = None


@triton.jit
def sigmoid_f32(x):
    # 1 / (1 + e^-x); exp overflows to inf for x << 0 and the result correctly becomes 0.
    return 1.0 / (1.0 + tl.exp(-x))


@triton.jit
def silu_f32(x):
    # x * sigmoid(x) as one division; for x << 0, e^-x overflows to inf and the result is -0 (no NaN).
    return x / (1.0 + tl.exp(-x))


@triton.jit
def floor16(n):
    # n rounded down to a multiple of 16. Where the caller has checked n % 16 == 0 this equals n, and
    # Triton's axis analysis knows the result is divisible by 16: masks `cols < floor16(n)` then stay
    # constant over 16 lanes and loads/stores vectorize even though `n` carries no divisibility hint.
    return (n // 16) * 16



@triton.jit
def pdl_enter(PDL: tl.constexpr):
    """Programmatic dependent launch (sm_90+; vkc.spec.with_pdl compiles PDL=True and sets the launch attribute
    together). A kernel launched with the attribute may start while the previous kernel in its stream still
    runs, so everything before this call may read only the model's weights (never written while a step runs):
    no activation, state, cache or index read, no store. ``gdc_wait`` then blocks until the previous kernel has
    finished and its writes are visible; ``gdc_launch_dependents`` right after lets the next kernel start its
    own pre-wait part. Trigger after wait: when kernel N + 1 starts, kernel N - 1 has completed. PDL=False (the
    archs without griddepcontrol, and Triton's interpreter) emits nothing."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _prefetch_l2_lines(ptrs, mask):
    """``prefetch.global.L2::evict_last`` of each address where ``mask`` (sm_80+). Triton's interpreter runs no
    inline PTX: tests/interp_fixes.py replaces this name there by a checked load of the same addresses."""
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2::evict_last [$1]; mov.b32 $0, 0; }",
        "=r,l,r", [ptrs, mask.to(tl.int32)], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def l2_prefetch(base, n_bytes, LINES: tl.constexpr):
    """Ask L2 to fetch the byte range [base, base + n_bytes) (``base`` a byte pointer) and keep it (evict_last):
    one instruction per 128-byte line, fire and forget -- no register receives the data and nothing waits for it
    (e.g. a kernel's weights before its grid-dependency wait, kernels_src/gdn_decode). Every address formed is
    inside the range (line l is base + 128 l with 128 l < n_bytes); n_bytes <= 0 touches nothing. A prefetch
    changes no value."""
    lines = (n_bytes + 127) // 128
    r = tl.arange(0, LINES)
    for l in range(0, lines, LINES):
        li = l + r
        _prefetch_l2_lines(base + li.to(tl.int64) * 128, li < lines)


@triton.jit
def l2_prefetch_rows(rows, n_bytes, row_ok, LINES: tl.constexpr):
    """l2_prefetch of [rows[i], rows[i] + n_bytes) for every row i where row_ok[i] (``rows`` a block of byte
    pointers, one range per row, all of n_bytes): LINES 128-byte lines of every row per round. Every address
    formed is inside its row's range; n_bytes <= 0 touches nothing. Meant for weights before a kernel's
    grid-dependency wait (pdl_enter) where the kernel before it leaves HBM idle (the router after a norm,
    kernels_src/moe/route.py); BENCHMARKS.md (session 29) has where it did not pay."""
    lines = (n_bytes + 127) // 128
    r = tl.arange(0, LINES)
    for l in range(0, lines, LINES):
        li = l + r
        _prefetch_l2_lines(rows[:, None] + li.to(tl.int64)[None, :] * 128, row_ok[:, None] & (li < lines)[None, :])
