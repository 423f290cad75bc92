"""AOT specs of the embedding family: the token embedding gather (kernel in embedding.py).

The kernel comes as ``.a16`` (all pointers and row strides carry div=16, which the runtime checks) and
``.any`` (no hints). V and N never carry hints; the kernel branches on ``N % 16`` internally.

Grid (axis 0 first):
  embedding.*                (T, cdiv(N, BLOCK))
"""
from vkc.spec import Arg, KernelSpec, with_pdl


def _args(params, aligned):
    """params: (name, type, aligned_hint). The hint is applied only in the aligned variant."""
    return [Arg(n, t, div=16 if (aligned and h) else None) for n, t, h in params]


_VARIANTS = (("a16", True), ("any", False))

# (name, type, gets div=16 in .a16)
_EMBEDDING = [
    ("ids_ptr", "*i32", True), ("table_ptr", "*bf16", True), ("out_ptr", "*bf16", True),
    ("stride_table", "i32", True), ("stride_out", "i32", True), ("V", "i32", False), ("N", "i32", False),
]

SPECS = []

for _sfx, _al in _VARIANTS:
    SPECS.append(KernelSpec(
        name=f"embedding.{_sfx}", source="embedding.py", entry="embedding_kernel",
        args=_args(_EMBEDDING, _al), constexprs={"BLOCK": 1024}, num_warps=4, num_stages=1))

del _sfx, _al

SPECS = [with_pdl(s) for s in SPECS]  # decode steps: programmatic dependent launch (common.py pdl_enter)
