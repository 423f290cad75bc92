"""Specs of the self-test family (ABI probe, fp32-scalar kernel, empty kernel)."""
from vkc.spec import Arg, KernelSpec

SPECS = [
    KernelSpec(
        name="abi_probe", source="abi.py", entry="abi_probe_kernel",
        args=[Arg("out_ptr", "*fp64", div=16), Arg("a_i1", "i1"), Arg("a_i8", "i8"), Arg("a_i16", "i16"),
              Arg("a_i32", "i32"), Arg("a_i64", "i64"), Arg("a_u32", "u32"), Arg("a_fp16", "fp16"),
              Arg("a_bf16", "bf16"), Arg("a_fp32", "fp32"), Arg("a_fp64", "fp64"), Arg("tail", "i32")],
        num_warps=1,
    ),
    KernelSpec(
        name="scale_add.b1024", source="abi.py", entry="scale_add_kernel",
        args=[Arg("x_ptr", "*fp32", div=16), Arg("y_ptr", "*fp32", div=16), Arg("out_ptr", "*fp32", div=16),
              Arg("n", "i32"), Arg("alpha", "fp32")],
        constexprs={"BLOCK": 1024}, num_warps=4,
    ),
    KernelSpec(
        name="empty", source="abi.py", entry="empty_kernel",
        args=[Arg("x_ptr", "*i8"), Arg("n", "i32")], num_warps=1,
    ),
]
