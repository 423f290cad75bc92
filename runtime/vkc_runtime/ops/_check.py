"""Input validation shared by the typed ops: every bad input is refused before any launch, with the op
name, the argument and what was expected.

Row-op conventions (ops.norm, ops.rope, ops.act, ops.embedding):
All tensors are bf16 on one CUDA device (torch/cupy tensors, DLPack producers or vkc DeviceArrays); math
is fp32 inside the kernels. Rows may be strided; the last dimension must be contiguous. When every
pointer is 16-byte aligned and every row stride is a multiple of 16 elements the vectorized `.a16`
specialization runs, otherwise the `.any` one. Pass ``out=`` (and never allocate) inside graph capture.
With ``out=`` and torch tensors, a call whose inputs have the layout of a recent call of the same op is a bound
call (vkc_runtime.bound): no revalidation, the recorded launch with the new pointers.
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import driver, memory
from ..stream import resolve_stream


class OpError(ValueError):
    """An op refused its inputs (shape, dtype, stride, alignment or device)."""


def tensor(op: str, name: str, obj: Any, dtype: str, ndim: int | None = None,
           shape: Sequence[int | None] | None = None, inner_contiguous: bool = True):
    try:
        t = memory.as_tensor(obj, name)
    except (TypeError, ValueError) as e:  # memory's messages already start with the argument name
        msg = str(e)
        raise OpError(f"{op}: {msg if msg.startswith(name + ':') else f'{name}: {msg}'}") from None
    if t.dtype != dtype:
        raise OpError(f"{op}: {name} must be {dtype}, got {t.dtype}")
    ts, st = t.shape, t.strides
    if ndim is not None and len(ts) != ndim:
        raise OpError(f"{op}: {name} must have {ndim} dims, got shape {tuple(ts)}")
    if shape is not None and ts != shape:  # an exact (tuple) match needs no per-dim walk: the per-call fast path
        for i, (got, want) in enumerate(zip(ts, shape)):
            if want is not None and got != want:
                raise OpError(f"{op}: {name} has shape {tuple(ts)}, expected dim {i} == {want} "
                              f"(expected {tuple('*' if s is None else s for s in shape)})")
    if inner_contiguous and ts and ts[-1] > 1 and st[-1] != 1:
        raise OpError(f"{op}: {name} must be contiguous in its last dim (strides {tuple(st)})")
    if st and min(st) < 0:  # rare: find out whether a dim that matters (extent > 1) runs backwards
        for i in range(len(ts) - 1):
            if ts[i] > 1 and st[i] < 0:
                raise OpError(f"{op}: {name} has a negative stride")
    return t


def same_device(op: str, *ts) -> int:
    """The one device of the tensors; -1 (a producer that does not say, e.g. cupy's CUDA array interface)
    matches any."""
    devs = {t.device for t in ts if t.device >= 0}
    if len(devs) > 1:
        raise OpError(f"{op}: all tensors must be on one device, got devices {sorted(devs)}")
    return devs.pop() if devs else -1


def row_stride(t) -> int:
    """Element stride between rows of a [rows, cols] (or [rows, heads, dim] flattened) tensor."""
    return int(t.strides[0]) if t.shape[0] > 1 else int(max(t.strides[0], 1))


def aligned(ptrs: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether the `.a16` variant's promises hold: every pointer 16-byte aligned, every stride % 16 == 0."""
    return all(p % 16 == 0 for p in ptrs) and all(s % 16 == 0 for s in strides)


def fits_i32(op: str, **vals: int) -> None:
    for k, v in vals.items():
        if not (0 <= v < 2**31):
            raise OpError(f"{op}: {k}={v} does not fit the kernel's int32 argument")


def stream_of(stream: Any) -> int:
    return resolve_stream(stream)


# -- small helpers shared by the ops modules ------------------------------------------------------------

BF16 = "bfloat16"


_sms: dict[int, int] = {}


def sm_count(dev: int) -> int:
    """SMs of device ordinal ``dev`` (a negative ordinal, a host-only tensor's: device 0), cached per device
    for the ops' launch rules (asked on every call)."""
    n = _sms.get(dev)
    if n is None:
        n = _sms.setdefault(dev, int(driver.sm_count(max(int(dev), 0))))
    return n


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def grid_y(op: str, n: int) -> int:
    """``n`` programs on grid axis y, refused above the driver's limit."""
    if n > 65535:
        raise OpError(f"{op}: the launch needs {n} programs on grid axis y (limit 65535)")
    return n


def variant(ptrs: Sequence[int], strides: Sequence[int]) -> str:
    """The row kernels' specialization suffix: ``a16`` when :func:`aligned`, else ``any``."""
    return "a16" if aligned(ptrs, strides) else "any"


VARIANTS = ("a16", "any")  # every value :func:`variant` returns


def bindable(out, *slots):
    """The slots of a bound call, or None when the op allocated its output (nothing to bind)."""
    return None if out is None else slots


def nonempty(*dims: int) -> bool:
    return all(d > 0 for d in dims)


# ---------------------------------------------------------------- quantized GEMM operands (gemm_fp8, gemm_fp4)

FP8 = "float8_e4m3fn"


def fp8_tensor(op, name, obj, shape=None):
    """A 2-D float8_e4m3fn tensor, or its uint8 bytes."""
    try:
        return tensor(op, name, obj, FP8, ndim=2, shape=shape)
    except OpError as e:
        if f"must be {FP8}" not in str(e):
            raise
    try:
        return tensor(op, name, obj, "uint8", ndim=2, shape=shape)
    except OpError as e:
        if "must be uint8" in str(e):
            raise OpError(f"{op}: {name} must be {FP8} (or its uint8 bytes), got {str(e).rsplit(' ', 1)[-1]}") \
                from None
        raise


def span(t) -> tuple[int, int]:
    if any(s == 0 for s in t.shape):
        return t.ptr, t.ptr
    hi = t.ptr + (sum((s - 1) * st for s, st in zip(t.shape, t.strides)) + 1) * t.itemsize
    return t.ptr, hi


def no_overlap(op, out_name, o, **inputs):
    o0, o1 = span(o)
    for name, t in inputs.items():
        a0, a1 = span(t)
        if a0 < o1 and o0 < a1:
            raise OpError(f"{op}: {out_name} must not overlap {name}")


def rows16(op, name, t, cols_name: str, cols: int) -> int:
    """Row stride of a [rows, cols] operand with the div=16 promises (pointer 16-byte aligned, stride % 16)."""
    if t.ptr % 16:
        raise OpError(f"{op}: {name} data pointer {t.ptr:#x} is not 16-byte aligned")
    ld = row_stride(t) if t.shape[0] > 1 else cols  # one row: its stride is never used
    if ld % 16:
        raise OpError(f"{op}: {name} row stride {ld} must be a multiple of 16 elements")
    if ld < cols:
        raise OpError(f"{op}: {name} rows overlap (row stride {ld} < {cols_name} = {cols})")
    return ld


def f32_aligned(op, name, t):
    if t.ptr % 4:
        raise OpError(f"{op}: {name} data pointer {t.ptr:#x} is not 4-byte aligned")


def vector_step(op, name, t, n: int, what: str) -> int:
    """Element step of a scale with 1 element (-> 0) or ``n`` elements along one dim (shape (n,), (n, 1), ...)."""
    f32_aligned(op, name, t)
    numel = 1
    for d in t.shape:
        numel *= d
    if numel == 1:
        return 0
    dims = [i for i, d in enumerate(t.shape) if d != 1]
    if numel != n or len(dims) != 1:
        raise OpError(f"{op}: {name} has shape {tuple(t.shape)}: expected 1 element (per tensor) or {n} "
                      f"({what}: shape ({n},) or ({n}, 1))")
    step = int(t.strides[dims[0]])
    if step <= 0:
        raise OpError(f"{op}: {name} must have a positive element stride, got {step}")
    return step
