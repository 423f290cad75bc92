"""The router's logits kernels as Triton's software pipeliner lowers them for sm_90a: every shared-memory
buffer an asynchronous wgmma reads must have num_stages slots and no other reader in the loop.

Why: route.logits.large once used its x tile twice in the K loop (the tl.dot and a register sum for the
shared-expert gate). Triton 3.9's pipeliner then gave that tile num_stages - 1 buffers while it still issued
the wgmma asynchronously (one group left pending), so the copy prefetching tile i + 2 overwrote the slot the
wgmma of tile i was still reading: wrong, run-to-run different logits on the H200 at every M that took the
large tiles (upstream: triton-lang/triton issue 6691, PR 7110). Triton's interpreter runs tl.dot
synchronously and cannot see this; these tests read the TTGIR the regen compile path produces (the same
function and options, in a worker environment like regen's), so the race's precondition fails on a CPU."""
from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from tests.kernel_testing import ROOT

pytest.importorskip("triton")

# compile_base as regen runs it, with triton.compile wrapped to keep the TTGIR (stdout: one JSON object)
_DUMP = r"""
import json, sys
from pathlib import Path
sys.path[:0] = [sys.argv[1], str(Path(sys.argv[1]) / "aot")]
import triton
from vkc import compile as C, discover
kept = {}
_orig = triton.compile
def _keep(*a, **k):
    kept["k"] = _orig(*a, **k)
    return kept["k"]
triton.compile = _keep
spec = {s.name: s for s in discover.load_specs(Path(sys.argv[1]), "moe")}[sys.argv[2]]
rs = spec.for_arch(sys.argv[3])
C.compile_base(Path(sys.argv[1]), rs)
print(json.dumps({"ttgir": kept["k"].asm["ttgir"], "num_stages": rs.num_stages}))
"""

_LOC = re.compile(r"\s*loc\((?:[^()]|\([^()]*\))*\)")
_DEF = re.compile(r"^(%[\w#]+)(?::\d+)? = ([\w.]+)\s*(.*)$")
_OPERAND = re.compile(r"%[\w]+(?:#\d+)?")


def ttgir_of(name: str, arch: str, cache_dir) -> tuple[str, int]:
    from vkc.compile import worker_env

    env = {**worker_env(), "TRITON_CACHE_DIR": str(cache_dir)}  # a fresh cache, like regen's
    r = subprocess.run([sys.executable, "-c", _DUMP, str(ROOT), name, arch], capture_output=True, text=True,
                       env=env, timeout=600, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    return d["ttgir"], int(d["num_stages"])


def wgmma_buffers(ttgir: str) -> list[dict]:
    """Per asynchronous warp_group_dot: for each shared-memory operand, the local_alloc it indexes (slots)
    and whether a local_load reads that allocation too. Values are resolved through region scopes (MLIR
    reuses names in sibling regions)."""
    scopes: list[dict[str, tuple[str, list[str], str]]] = [{}]

    def lookup(v):
        for s in reversed(scopes):
            if v in s:
                return s[v]
        return None

    def root(v):
        while True:
            d = lookup(v)
            if d is None:
                return None
            op, args, text = d
            if op == "ttg.local_alloc":
                return v, text
            if op not in ("ttg.memdesc_index", "ttg.memdesc_trans", "ttg.memdesc_subslice") or not args:
                return None
            v = args[0]

    dots, loads = [], set()
    for raw in ttgir.splitlines():
        line = _LOC.sub("", raw).strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("}"):
            scopes.pop()
        m = _DEF.match(line)
        if m:
            name, op, rest = m.groups()
            args = _OPERAND.findall(rest.split(":")[0]) if op != "ttg.local_alloc" else []
            scopes[-1][name.split("#")[0]] = (op, args, rest)
            if op == "ttng.warp_group_dot" and "isAsync = true" in rest:
                dots.append([root(a) for a in args[:2]])
            if op == "ttg.local_load" and args:
                r = root(args[0])
                if r:
                    loads.add(r[0])
        if line.endswith("{"):
            scopes.append({})
    out = []
    for operands in dots:
        for r in operands:
            if r is None:
                continue
            v, text = r
            slots = int(re.search(r"memdesc<(\d+)x", text).group(1))
            out.append({"alloc": v, "slots": slots, "local_load": v in loads})
    return out


@pytest.mark.parametrize("name", ["route.logits.large", "route.logits.small"])
def test_router_logits_wgmma_operands_fully_buffered(name, tmp_path):
    ttgir, stages = ttgir_of(name, "sm_90a", tmp_path)
    bufs = wgmma_buffers(ttgir)
    if name == "route.logits.large":
        # 128 x 128 x 64 tiles on 8 warps: two warp groups of async wgmma over x and gate_w (both from shared)
        assert len({b["alloc"] for b in bufs}) == 2, bufs
    for b in bufs:
        assert b["slots"] == stages, f"{name}: a wgmma operand buffer has {b['slots']} slots, not {stages}: {bufs}"
        assert not b["local_load"], f"{name}: a wgmma operand tile is also read into registers: {bufs}"


def test_the_check_sees_the_mixed_use_pattern():
    """The checker on the TTGIR shape of the old kernel (trimmed from its sm_90a dump): x in a 2-slot buffer
    read by the async wgmma and by a local_load."""
    old = """
    %62 = ttg.local_alloc : () -> !ttg.memdesc<2x128x64xbf16, #shared, #smem, mutable> loc(#loc1)
    %63 = ttg.local_alloc : () -> !ttg.memdesc<3x128x64xbf16, #shared, #smem, mutable> loc(#loc2)
    %sh_11:3 = scf.for %sh_14 = %29 to %31 step %c64_i32 iter_args(%arg11 = %cst) -> (tensor<128x128xf32>) {
      %122 = ttg.memdesc_index %62[%sh_27] : !ttg.memdesc<2x128x64xbf16> -> !ttg.memdesc<128x64xbf16>
      %123 = ttg.local_load %122 token %121 : !ttg.memdesc<128x64xbf16> -> tensor<128x64xbf16, #blocked>
      %124 = ttg.memdesc_index %63[%sh_24] : !ttg.memdesc<3x128x64xbf16> -> !ttg.memdesc<128x64xbf16>
      %125 = ttg.memdesc_trans %124 {order = array<i32: 1, 0>} : !ttg.memdesc<128x64xbf16> -> !ttg.memdesc<64x128xbf16>
      %126 = ttng.warp_group_dot %122, %125, %arg11 {isAsync = true} : !ttg.memdesc<128x64xbf16>
      scf.yield %126 : tensor<128x128xf32, #mma>
    }
    """
    bufs = wgmma_buffers(old)
    assert bufs == [{"alloc": "%62", "slots": 2, "local_load": True},
                    {"alloc": "%63", "slots": 3, "local_load": False}]
