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
