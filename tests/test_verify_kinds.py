"""The ``cute-so`` artifact kind's verify rules, on a tiny host shared object built here with the system C
compiler (skipped cleanly without one) and a hand-made manifest in an artifact root: ELF type, class and
machine vs the recorded host platform, exported dynamic symbols, embedded cubins' SASS arch, sha256/size,
path and loader. No Triton needed (the embedded cubins are the committed selftest ones)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vkc import discover, hostelf, manifest, verify
from vkc_contract import layout
from vkc_contract.tactics import manifest_block as tactics_block
from vkc_contract.hashing import sha256_bytes
from tests.aot_tree import REPO, assert_caught, assert_found, edit_manifest, problems

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
HOST = layout.current_host_platform()
OTHER = next((h for h in layout.HOST_PLATFORMS if h != HOST), None)
if CC is None or HOST is None:
    pytest.skip("needs a C compiler (cc) on an x86_64 or aarch64 host", allow_module_level=True)

ARCH = "sm_90a"
SYMBOLS = ["vkc_gemm_bf16_launch", "vkc_gemm_fp8_launch"]
SRC = """
int vkc_gemm_bf16_launch(void *args) { return args != 0; }
int vkc_gemm_fp8_launch(void *args) { return 2 * (args != 0); }
__attribute__((visibility("hidden"))) int vkc_gemm_hidden(void) { return 3; }
static int vkc_gemm_static(void) { return 4; }
int vkc_gemm_use_static(void) { return vkc_gemm_static(); }
"""


LIBM_SRC = "double cos(double);\ndouble vkc_gemm_uses_libm(double x) { return cos(x); }\n"


def cubin_array(arch: str) -> str:
    data = (REPO / f"vendored/{arch}/selftest/empty.cubin").read_bytes()
    return ("__attribute__((aligned(16))) const unsigned char vkc_gemm_cubin_" + arch + "[] = {"
            + ",".join(str(b) for b in data) + "};\n")


def build(tmp: Path, name: str, extra: str = "", flags: tuple[str, ...] = ("-shared", "-fPIC")) -> bytes:
    src = tmp / f"{name}.c"
    src.write_text(SRC + extra)
    out = tmp / f"{name}.out"
    r = subprocess.run([CC, *flags, "-O0", "-o", str(out), str(src)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"{CC} cannot build a shared object here: {r.stderr[-500:]}")
    return out.read_bytes()


@pytest.fixture(scope="module")
def so_bytes(tmp_path_factory) -> dict[str, bytes]:
    tmp = tmp_path_factory.mktemp("so")
    return {"good": build(tmp, "good", cubin_array(ARCH)), "sm80": build(tmp, "sm80", cubin_array("sm_80")),
            "nocubin": build(tmp, "nocubin"), "object": build(tmp, "object", flags=("-c", "-fPIC")),
            "libm": build(tmp, "libm", cubin_array(ARCH) + LIBM_SRC, flags=("-shared", "-fPIC", "-Wl,--no-as-needed",
                                                                             "-lm"))}


def so_entry(path: str, data: bytes, host: str, symbols: list[str], sass: str | None = ARCH) -> dict:
    art = {"kind": "cute-so", "loader": "cute-so", "host_platform": host, "path": path,
           "sha256": sha256_bytes(data), "size": len(data), "symbols": symbols}
    if sass:
        art["sass_arch"] = sass
    return art


def make_root(root: Path, data: bytes, sass: str | None = ARCH) -> Path:
    """An artifact root (what a wheel installs) with one cute-so file shared by two kernels of family gemm."""
    (root / "manifests").mkdir(parents=True)
    shutil.copy2(REPO / "manifests/schema.json", root / "manifests/schema.json")
    rel = layout.kind_relpath("cute-so", ARCH, "gemm.bf16", HOST)
    (root / rel).parent.mkdir(parents=True)
    (root / rel).write_bytes(data)
    tc = json.loads((REPO / f"manifests/{ARCH}.json").read_text())["toolchain"]
    tc["generator_sha256"] = discover.generator_hash(None)
    doc = {"schema_version": layout.SCHEMA_VERSION, "arch": ARCH, "target": {"backend": "cuda", "cc": 90, "warp_size": 32},
           "toolchain": tc, "sources": {},
           "kernels": {"gemm.bf16": {"inputs": {"family": "gemm"}, "artifacts": [so_entry(rel, data, HOST, SYMBOLS[:1], sass)]},
                       "gemm.fp8": {"inputs": {"family": "gemm"}, "artifacts": [so_entry(rel, data, HOST, SYMBOLS[1:], sass)]}}}
    doc["tactics"] = tactics_block(doc["kernels"])  # no GEMM launcher ABI in these entries: an empty tactic set
    manifest.atomic_write(manifest.manifest_path(root, ARCH), manifest.canonical(manifest.seal(doc)))
    return root


def so_path(root: Path) -> Path:
    return root / layout.kind_relpath("cute-so", ARCH, "gemm.bf16", HOST)


def each_artifact(fn):
    def edit(doc):
        for k in doc["kernels"].values():
            for art in k["artifacts"]:
                fn(art)
    return edit


@pytest.fixture()
def root(tmp_path, so_bytes) -> Path:
    return make_root(tmp_path / "artifacts", so_bytes["good"])


# ------------------------------------------------------------------ the reader

def test_host_elf_reader(so_bytes):
    so = hostelf.parse(so_bytes["good"])
    assert so.is_platform(layout.HOST_ELF_MACHINE[HOST]) and so.description == f"64-bit little-endian {HOST}"
    assert set(SYMBOLS) | {"vkc_gemm_use_static", f"vkc_gemm_cubin_{ARCH}"} <= so.exported
    assert "vkc_gemm_hidden" not in so.exported and "vkc_gemm_static" not in so.exported
    assert [c.sm for c in so.cubins] == [90] and "empty_kernel" in so.cubins[0].kernels
    assert so.cubins[0].data == (REPO / f"vendored/{ARCH}/selftest/empty.cubin").read_bytes()  # exact extent
    assert set(so.needed) <= hostelf.ALLOWED_NEEDED
    assert "libm.so.6" in hostelf.parse(so_bytes["libm"]).needed
    assert [c.sm for c in hostelf.parse(so_bytes["sm80"]).cubins] == [80]
    assert hostelf.parse(so_bytes["nocubin"]).cubins == []
    with pytest.raises(hostelf.HostElfError, match="not a shared object"):
        hostelf.parse(so_bytes["object"])
    with pytest.raises(hostelf.HostElfError, match="no ELF header"):
        hostelf.parse(b"#!/bin/sh\n" * 10)


# ------------------------------------------------------------------ verify, cute-so rules

def test_clean_cute_so_root_verifies(root):
    assert problems(root, verify.INSTALLED) == []


def test_cute_so_wrong_machine(root):
    if OTHER is None:
        pytest.skip("no other host platform")
    other_rel = layout.kind_relpath("cute-so", ARCH, "gemm.bf16", OTHER)
    so_path(root).rename(root / other_rel)
    edit_manifest(root, ARCH, each_artifact(lambda a: a.update(host_platform=OTHER, path=other_rel)))
    P = assert_caught(root, "host-machine", f"{other_rel} is built for 64-bit little-endian {HOST}, but the manifest "
                      f"records host platform {OTHER}", mode=verify.INSTALLED)
    assert len(P) == 1, P  # one file shared by two kernels: reported once


def test_cute_so_machine_byte_patched(root):
    """A forger patches e_machine (and reseals the hash): the header no longer says the recorded platform."""
    data = bytearray(so_path(root).read_bytes())
    data[0x12:0x14] = (3).to_bytes(2, "little")  # EM_386
    so_path(root).write_bytes(bytes(data))
    edit_manifest(root, ARCH, each_artifact(lambda a: a.update(sha256=sha256_bytes(bytes(data)))))
    assert_caught(root, "host-machine", "is built for 64-bit little-endian i386", mode=verify.INSTALLED)


def test_cute_so_missing_symbol(root):
    edit_manifest(root, ARCH, lambda d: d["kernels"]["gemm.fp8"]["artifacts"][0]["symbols"].append("vkc_gemm_fp4_launch"))
    P = assert_caught(root, "missing-symbol", f"gemm.fp8: {so_path(root).relative_to(root).as_posix()} does not export "
                      "vkc_gemm_fp4_launch", mode=verify.INSTALLED)
    assert len(P) == 1, P


def test_cute_so_hidden_symbol_is_not_exported(root):
    edit_manifest(root, ARCH, lambda d: d["kernels"]["gemm.bf16"]["artifacts"][0].update(
        symbols=["vkc_gemm_bf16_launch", "vkc_gemm_hidden"]))
    assert_caught(root, "missing-symbol", "does not export vkc_gemm_hidden", mode=verify.INSTALLED)


def test_cute_so_modified_byte(root):
    data = bytearray(so_path(root).read_bytes())
    data[len(data) // 2] ^= 0x01
    so_path(root).write_bytes(bytes(data))
    P = assert_caught(root, "artifact-modified", "gemm.bf16: artifact vendored/sm_90a/gemm/gemm."
                      f"{HOST}.so was modified (sha256/size mismatch)", mode=verify.INSTALLED)
    assert len(P) == 1, P


def test_cute_so_missing_file(root):
    so_path(root).unlink()
    assert_caught(root, "artifact-missing", f"artifact vendored/sm_90a/gemm/gemm.{HOST}.so is missing",
                  mode=verify.INSTALLED)


def test_cute_so_path(root):
    bad = f"vendored/{ARCH}/gemm/libgemm.{HOST}.so"
    so_path(root).rename(root / bad)
    edit_manifest(root, ARCH, each_artifact(lambda a: a.update(path=bad)))
    assert_caught(root, "artifact-path", f"artifact path {bad} != vendored/{ARCH}/gemm/gemm.{HOST}.so",
                  mode=verify.INSTALLED)


def test_cute_so_loader(root):
    edit_manifest(root, ARCH, each_artifact(lambda a: a.update(loader="triton-cubin")))
    assert_caught(root, "kind-loader", "is a cute-so artifact, loaded by cute-so, but the manifest names loader "
                  "triton-cubin", mode=verify.INSTALLED)


def test_cute_so_not_a_shared_object(root, so_bytes):
    data = so_bytes["object"]
    so_path(root).write_bytes(data)
    edit_manifest(root, ARCH, each_artifact(lambda a: a.update(sha256=sha256_bytes(data), size=len(data))))
    assert_caught(root, "not-shared-object", "is not an ELF shared object (ELF type 1, not a shared object (ET_DYN))",
                  mode=verify.INSTALLED)


def test_cute_so_recorded_sass_of_another_arch(root):
    edit_manifest(root, ARCH, each_artifact(lambda a: a.update(sass_arch="sm_80")))
    assert_caught(root, "host-sass-recorded", "the manifest records SASS sm_80, not sm_90a's", mode=verify.INSTALLED)


def test_cute_so_embedded_cubin_of_another_arch(tmp_path, so_bytes):
    r = make_root(tmp_path / "r", so_bytes["sm80"])
    assert_caught(r, "embedded-sass", "embeds SASS for sm_80, not sm_90a", mode=verify.INSTALLED)


def test_cute_so_without_embedded_cubin(tmp_path, so_bytes):
    r = make_root(tmp_path / "r", so_bytes["nocubin"])
    assert_caught(r, "no-embedded-cubin", "embeds no cubin, but the manifest records SASS sm_90a", mode=verify.INSTALLED)
    assert problems(make_root(tmp_path / "r2", so_bytes["nocubin"], sass=None), verify.INSTALLED) == []


def test_cute_so_needs_host_platform(root):
    edit_manifest(root, ARCH, each_artifact(lambda a: a.pop("host_platform")))
    assert_caught(root, "schema-violation", "'host_platform' is a required property", mode=verify.INSTALLED)


def test_cute_so_stray_file(root):
    (root / f"vendored/{ARCH}/gemm/gemm.{OTHER or 'x'}.so").write_bytes(b"x")
    assert_caught(root, "extra-file", f"extra file vendored/{ARCH}/gemm/gemm.{OTHER or 'x'}.so is not in the manifest",
                  mode=verify.INSTALLED)


def test_cute_so_needs_more_than_glibc(tmp_path, so_bytes):
    r = make_root(tmp_path / "r", so_bytes["libm"])
    P = assert_caught(r, "host-needed", "needs libm.so.6 (only glibc is allowed", mode=verify.INSTALLED)
    assert len(P) == 1, P  # one file shared by two kernels: reported once


def test_cute_so_recorded_cubin_not_embedded(root):
    edit_manifest(root, ARCH, lambda d: d["kernels"]["gemm.bf16"].update(launch={"cubin_sha256": "ab" * 32}))
    P = assert_caught(root, "embedded-cubin-missing", "does not embed the kernel's recorded cubin abababababab",
                      mode=verify.INSTALLED)
    assert any(p.startswith(f"sm_90a: gemm.bf16: vendored/sm_90a/gemm/gemm.{HOST}.so does not") for p in P), P
    cub = sha256_bytes((REPO / f"vendored/{ARCH}/selftest/empty.cubin").read_bytes())
    edit_manifest(root, ARCH, lambda d: d["kernels"]["gemm.bf16"].update(launch={"cubin_sha256": cub}))
    assert problems(root, verify.INSTALLED) == []


def test_runtime_picks_the_host_platform_artifact(root):
    """vkc_runtime hands a cute-so entry to the cute-so loader, with this machine's file; an entry without one for
    this host platform is refused by name, never misloaded."""
    from vkc_runtime.artifacts import ArtifactSet
    from vkc_runtime.errors import ArtifactError
    from vkc_runtime.loaders import loader_of

    s = ArtifactSet(root, ARCH)
    assert loader_of("gemm.bf16", s.entry("gemm.bf16"), ARCH) == "cute-so"
    assert s.path("gemm.bf16") == so_path(root) and s.artifact("gemm.bf16")["host_platform"] == HOST
    s.kernels["gemm.bf16"]["artifacts"][0]["host_platform"] = OTHER or "riscv"
    with pytest.raises(ArtifactError, match=f"no artifact for this host platform \\({HOST}; built for"):
        s.path("gemm.bf16")


def test_inspect_lists_host_code_kernels(root):
    r = subprocess.run([sys.executable, "-m", "vkc_cli", "inspect", "--root", str(root), "--json"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert sorted((x["base"], x["kind"]) for x in rows) == [("gemm.bf16", "cute-so"), ("gemm.fp8", "cute-so")]


# ------------------------------------------------------------------ the CuTe lane's toolchain record

def test_cute_dsl_pin(root):
    edit_manifest(root, ARCH, lambda d: d["toolchain"]["cutlass_dsl"].update(version="4.7.0"))
    assert_caught(root, "cutlass-dsl-pin", "CuTe kernels built with nvidia-cutlass-dsl 4.7.0 (cu12), pinned "
                  "nvidia-cutlass-dsl 4.8.1 (cu12)", mode=verify.INSTALLED)
    edit_manifest(root, ARCH, lambda d: d["toolchain"]["cutlass_dsl"].update(version="4.8.1", flavor="cu13"))
    assert_caught(root, "cutlass-dsl-pin", "built with nvidia-cutlass-dsl 4.8.1 (cu13)", mode=verify.INSTALLED)


def test_cute_dsl_unrecorded(root):
    edit_manifest(root, ARCH, lambda d: d["toolchain"].update(cutlass_dsl=None))
    assert_caught(root, "cutlass-dsl-unrecorded", "the manifest has CuTe kernels but records no CuTe DSL toolchain",
                  mode=verify.INSTALLED)


def test_cute_shim_changed(tmp_path):
    """In a checkout, the shim sources linked into every cute-so must be the ones the manifest recorded."""
    from vkc import cute_lane
    doc = json.loads((REPO / f"manifests/{ARCH}.json").read_text())
    shutil.copytree(REPO / cute_lane.SHIM_DIR, tmp_path / cute_lane.SHIM_DIR)
    assert verify._cute_toolchain(tmp_path, ARCH, doc) == []
    with open(tmp_path / cute_lane.SHIM_DIR / "vkc_cute_shim.c", "a") as f:
        f.write("/* edited */\n")
    P = verify._cute_toolchain(tmp_path, ARCH, doc)
    assert_found(P, "cute-shim-changed", "the CuTe driver-API shim csrc/cute_shim/vkc_cute_shim.c changed since regen")
    assert len(P) == 1, P
