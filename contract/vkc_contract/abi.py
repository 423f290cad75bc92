"""The Triton kernel ABI as vkc launches it (ARCHITECTURE.md, "Launch ABI"). One owner for type widths and codes.

A Triton cubin's parameters are its non-constexpr arguments in declaration order, then two hidden
pointers (``global_scratch``, ``profile_scratch``). Scalars are passed at their declared width: fp32 is
4 bytes (never a C double), i1 is one byte, fp16/bf16 two bytes.

Each parameter gets a one-character *pack code*; the Python packer (:mod:`vkc_runtime.pack`) and the
native launcher (``csrc/launcher.cpp``) both interpret exactly these codes.
"""
from __future__ import annotations

# triton signature type -> (pack code, size in bytes, PTX .param spelling)
_SCALARS: dict[str, tuple[str, int, str]] = {
    "i1": ("?", 1, ".u8"),
    "i8": ("b", 1, ".u8"),
    "u8": ("B", 1, ".u8"),
    "i16": ("h", 2, ".u16"),
    "u16": ("H", 2, ".u16"),
    "i32": ("i", 4, ".u32"),
    "u32": ("I", 4, ".u32"),
    "i64": ("q", 8, ".u64"),
    "u64": ("Q", 8, ".u64"),
    "fp16": ("e", 2, ".b8[2]"),
    "bf16": ("E", 2, ".b8[2]"),
    "fp32": ("f", 4, ".f32"),
    "fp64": ("d", 8, ".f64"),
}
POINTER_CODE = "p"
POINTER_SIZE = 8
PACK_CODES = frozenset([POINTER_CODE] + [v[0] for v in _SCALARS.values()])
PACK_SIZES = {POINTER_CODE: POINTER_SIZE, **{v[0]: v[1] for v in _SCALARS.values()}}

# The two trailing parameters Triton 3.6-3.9 always appends.
HIDDEN_PARAMS = ("global_scratch", "profile_scratch")
HIDDEN_TYPE = "*i8"

# Element dtypes a pointer may point at (triton spelling -> numpy-ish name and itemsize).
POINTEE = {
    "bf16": ("bfloat16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4), "fp64": ("float64", 8),
    "i8": ("int8", 1), "u8": ("uint8", 1), "i16": ("int16", 2), "i32": ("int32", 4), "u32": ("uint32", 4),
    "i64": ("int64", 8), "i1": ("bool", 1), "fp8e4nv": ("float8_e4m3fn", 1), "fp8e5": ("float8_e5m2", 1),
}

DIVISIBILITY = 16  # the only tt.divisibility value vkc specs use


def is_pointer(ty: str) -> bool:
    return ty.startswith("*")


def pack_code(ty: str) -> str:
    if is_pointer(ty):
        if ty[1:] not in POINTEE:
            raise ValueError(f"unsupported pointer element type {ty!r}")
        return POINTER_CODE
    try:
        return _SCALARS[ty][0]
    except KeyError:
        raise ValueError(f"unsupported scalar type {ty!r}; known: {sorted(_SCALARS)}") from None


def param_size(ty: str) -> int:
    return PACK_SIZES[pack_code(ty)]


def ptx_param_kind(ty: str) -> str:
    """How the parameter appears in the PTX ``.entry`` list (used by the ABI conformance tests)."""
    if is_pointer(ty):
        return ".u64"
    return _SCALARS[ty][2]
