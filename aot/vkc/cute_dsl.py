"""The DSL side of the CuTe lane: compile and export one arch's CuTe kernels (runs in the DSL's interpreter).

    CUTE_DSL_ARCH=<arch> $VKC_CUTE_PYTHON aot/vkc/cute_dsl.py <job.json> <out_dir> <result.json>

:mod:`vkc.cute_lane` starts this file (by path, standard library + the DSL only: vkc is not installed in the
DSL's environment) in a fresh process per (arch, host platform) because the DSL reads CUTE_DSL_ARCH once, at
import. ``job.json``: ``{"arch", "host", "root", "kernels": [CuteKernelSpec.job_json(), ...]}``. For each kernel it
writes ``<out_dir>/<export>.o`` (host code for the host platform: x86_64, or aarch64 through the DSL's
``--host-target linux-aarch64``), ``<export>.h`` (``export_to_c``) and ``<export>.cubin`` (the kernel the object
embeds), then ``result.json``: the DSL identity and per kernel the cubin/object sha256 and the facts of the
generated header the glue relies on (:func:`vkc.cute_glue.check_header` refuses any other layout).
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

# An explicit x86_64 target: left empty the DSL compiles the host object for the build machine's CPU (AVX-512 code
# from one build box, none from another: neither byte-identical across machines nor safe on hosts without it)
HOST_OPTIONS = {"x86_64": "--host-target 'llvm -mtriple=x86_64-unknown-linux-gnu -mcpu=x86-64-v2'",
                "aarch64": "--host-target linux-aarch64"}


def dsl_identity() -> dict:
    import cutlass
    ir = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    m = re.search(r"_cutlass_ir\.(cu\d+)\.", os.path.basename(getattr(ir, "__file__", "") or ""))
    return {"package": "nvidia-cutlass-dsl", "version": cutlass.__version__, "flavor": m.group(1) if m else None}


def header_facts(header: str, prefix: str) -> dict:
    """What the generated launcher relies on, read from the export's C header."""
    structs = {}
    for body, name in re.findall(r"typedef struct \{(.*?)\}\s*(\w+);", header, re.S):
        structs[name] = [" ".join(f.split()) for f in body.strip().rstrip(";").split(";") if f.strip()]
    ciface = re.findall(r"void (_mlir_" + re.escape(prefix) + r"__mlir_ciface_\w+)\(void \*\*args, int32_t num_args\);",
                        header)
    call = re.search(r"void \*args\[(\d+)\] = \{(.*?)\};", header, re.S)
    return {
        "tensor_structs": {k: v for k, v in structs.items() if k.startswith(f"{prefix}_Tensor_")},
        "ciface": ciface[0] if len(ciface) == 1 else None,
        "init": f"_mlir_{prefix}_cuda_init" if f"void _mlir_{prefix}_cuda_init(void **);" in header else None,
        "load_to_device": (f"_mlir_{prefix}_cuda_load_to_device"
                           if f"void _mlir_{prefix}_cuda_load_to_device(void **);" in header else None),
        "wrapper_args": " ".join(call.group(2).split()) if call else None,
        "wrapper_nargs": int(call.group(1)) if call else None,
    }


def fake_args(abi: str):
    """The fake tensors of one launcher ABI (what the compiled function's descriptors look like)."""
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_stream, make_fake_tensor

    if abi not in ("gemm_bf16", "gemm_fp8", "gemm_fp8_block"):
        raise SystemExit(f"unknown CuTe ABI {abi!r}")
    bf16 = cutlass.BFloat16
    ab = bf16 if abi == "gemm_bf16" else cutlass.Float8E4M3FN
    kdiv = 8 if abi == "gemm_bf16" else 16  # 16-byte TMA rows
    # 32-bit extents (the 4.8.1 header declares int32_t shape slots whatever the SymInt width), 64-bit row strides;
    # one SymInt per quantity so A/W share K, A/C share M, W/C share N
    m, n, k = cute.sym_int(), cute.sym_int(divisibility=8), cute.sym_int(divisibility=kdiv)
    lda, ldw = (cute.sym_int64(divisibility=kdiv) for _ in range(2))
    ldc = cute.sym_int64(divisibility=8)
    a = make_fake_tensor(ab, (m, k), (lda, 1), assumed_align=16)
    w = make_fake_tensor(ab, (n, k), (ldw, 1), assumed_align=16)
    c = make_fake_tensor(bf16, (m, n), (ldc, 1), assumed_align=16)
    if abi == "gemm_bf16":
        return a, w, c, cutlass.Int32(1), make_fake_stream()
    if abi == "gemm_fp8_block":
        # scale matrices, row-major with runtime row strides: sa [M, KB], sw [NB, KB] (KB = ceil(K / 128), NB =
        # ceil(N / 128))
        kb, nb = cute.sym_int(), cute.sym_int()
        sa = make_fake_tensor(cutlass.Float32, (m, kb), (cute.sym_int64(), 1), assumed_align=4)
        sw = make_fake_tensor(cutlass.Float32, (nb, kb), (cute.sym_int64(), 1), assumed_align=4)
        return a, w, c, sa, sw, cutlass.Int32(1), make_fake_stream()
    # scale vectors: M / N fp32 elements at a runtime element step (0: one scale broadcast)
    sa = make_fake_tensor(cutlass.Float32, (m,), (cute.sym_int64(),), assumed_align=4)
    sw = make_fake_tensor(cutlass.Float32, (n,), (cute.sym_int64(),), assumed_align=4)
    return a, w, c, sa, sw, cutlass.Int32(1), make_fake_stream()


def compile_kernel(job: dict, out_dir: Path, host: str) -> dict:
    import cutlass.cute as cute

    mod = importlib.import_module(job["module"])
    kernel = getattr(mod, job["kernel_class"])(**job["config"])
    t0 = time.perf_counter()
    opts = HOST_OPTIONS[host]
    fn = cute.compile(kernel, *fake_args(job["abi"]), **({"options": opts} if opts else {}))
    secs = time.perf_counter() - t0
    cubin = fn.__cubin__
    if not isinstance(cubin, bytes):  # the DSL hands back a path when its dump directory is missing
        raise RuntimeError(f"{job['base']}: no cubin bytes from the DSL (got {cubin!r})")
    name = job["export"]
    fn.export_to_c(str(out_dir), name, name)
    (out_dir / f"{name}.cubin").write_bytes(cubin)
    header = (out_dir / f"{name}.h").read_text()
    return {
        "base": job["base"],
        "compile_s": round(secs, 2),
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
        "object_sha256": hashlib.sha256((out_dir / f"{name}.o").read_bytes()).hexdigest(),
        "header": header_facts(header, name),
    }


def main(argv: list[str]) -> int:
    job, out_dir, result = json.loads(Path(argv[1]).read_text()), Path(argv[2]), Path(argv[3])
    arch, host = job["arch"], job["host"]
    if os.environ.get("CUTE_DSL_ARCH") != arch:
        raise SystemExit(f"CUTE_DSL_ARCH must be {arch} before the DSL is imported")
    if host not in HOST_OPTIONS:
        raise SystemExit(f"unknown host platform {host!r}")
    sys.path.insert(0, job["root"])  # kernels_src.<family>.<module>
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as dump:
        # the DSL writes the cubin only into an existing dump directory
        os.environ["CUTE_DSL_KEEP"] = "cubin"
        os.environ["CUTE_DSL_DUMP_DIR"] = dump
        done = [compile_kernel(k, out_dir, host) for k in job["kernels"]]
    result.write_text(json.dumps({"arch": arch, "host": host, "dsl": dsl_identity(), "kernels": done}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
