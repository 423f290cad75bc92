"""The DSL side of tools/cute/build.py: compile and export one arch's GEMM variants (runs in the DSL's venv).

    CUTE_DSL_ARCH=<arch> .venv-cute/bin/python tools/cute/dsl_compile.py <arch> <out_dir> <result.json> [<host>]

build.py starts this in a fresh process per arch because the DSL reads CUTE_DSL_ARCH once, at import. For each
variant it writes <out_dir>/<name>.o (host code for <host>: x86_64, the default, or aarch64 through the DSL's
``--host-target linux-aarch64``) and <name>.h (``export_to_c``) and <name>.cubin (the kernel the object
embeds), then <result.json>: the DSL version and toolkit flavor, and per variant the exported host symbols and
the tensor descriptor layout read from the generated header (build.py refuses a layout it does not expect).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def dsl_identity() -> dict:
    import cutlass
    ir = sys.modules.get("cutlass._mlir._mlir_libs._cutlass_ir")
    m = re.search(r"_cutlass_ir\.(cu\d+)\.", os.path.basename(getattr(ir, "__file__", "") or ""))
    return {"package": "nvidia-cutlass-dsl", "version": cutlass.__version__, "flavor": m.group(1) if m else None}


def header_facts(header: str, prefix: str) -> dict:
    """What build.py's generated launcher relies on, read from the export's C header."""
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


HOST_OPTIONS = {"x86_64": "", "aarch64": "--host-target linux-aarch64"}


def compile_variant(v, kernel_mod, out_dir: Path, host: str) -> dict:
    import cutlass
    import cutlass.cute as cute
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    bf16 = cutlass.BFloat16
    # a 32-bit M: the exported header of 4.8.1 declares int32_t shape slots whatever the SymInt width
    m = cute.sym_int()
    a = make_fake_compact_tensor(bf16, (m, v.k), stride_order=(1, 0), assumed_align=16)
    w = make_fake_compact_tensor(bf16, (v.n, v.k), stride_order=(1, 0), assumed_align=16)
    c = make_fake_compact_tensor(bf16, (m, v.n), stride_order=(1, 0), assumed_align=16)
    cfg = kernel_mod.Sm90GemmConfig(n=v.n, k=v.k, tile_m=v.tile_m, tile_n=v.tile_n, stages=v.stages,
                                    epi_stages=v.epi_stages, group_m=v.group_m)
    t0 = time.perf_counter()
    opts = HOST_OPTIONS[host]
    fn = cute.compile(kernel_mod.Sm90BF16Gemm(cfg), a, w, c, make_fake_stream(), **({"options": opts} if opts else {}))
    secs = time.perf_counter() - t0
    cubin = fn.__cubin__
    if not isinstance(cubin, bytes):  # the DSL hands back a path when its dump directory is missing
        raise RuntimeError(f"{v.name}: no cubin bytes from the DSL (got {cubin!r})")
    fn.export_to_c(str(out_dir), v.name, v.name)
    (out_dir / f"{v.name}.cubin").write_bytes(cubin)
    header = (out_dir / f"{v.name}.h").read_text()
    return {
        "name": v.name,
        "compile_s": round(secs, 2),
        "cubin_sha256": hashlib.sha256(cubin).hexdigest(),
        "object_sha256": hashlib.sha256((out_dir / f"{v.name}.o").read_bytes()).hexdigest(),
        "header": header_facts(header, v.name),
    }


def main(argv: list[str]) -> int:
    arch, out_dir, result = argv[1], Path(argv[2]), Path(argv[3])
    host = argv[4] if len(argv) > 4 else "x86_64"
    if os.environ.get("CUTE_DSL_ARCH") != arch:
        raise SystemExit(f"CUTE_DSL_ARCH must be {arch} before the DSL is imported")
    sys.path.insert(0, str(ROOT))
    from kernels_src.gemm import variants
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as dump:
        # the DSL writes the cubin only into an existing dump directory
        os.environ["CUTE_DSL_KEEP"] = "cubin"
        os.environ["CUTE_DSL_DUMP_DIR"] = dump
        import importlib
        mod = importlib.import_module(f"kernels_src.gemm.{variants.KERNEL_MODULE[arch]}")
        done = [compile_variant(v, mod, out_dir, host) for v in variants.variants_for(arch)]
    result.write_text(json.dumps({"arch": arch, "dsl": dsl_identity(), "variants": done}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
