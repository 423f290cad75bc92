"""The Gluon warp-specialised prefill (kernels_src/attn/prefill_ws.py) on CPU: it compiles for sm_90a through the
regen's own compile step (vkc.compile.compile_base, which checks the PTX parameter list against the runtime's
packer) with the ABI of the ``prefill.d256.*.tma`` spec it is meant to replace, and the SASS has the structure the
kernel is built for. Its numbers and its correctness are GPU questions (the session-38 variant root, not run yet).

Checked per variant (BLOCK_N 64; D = 256 gated without ping-pong and ungated with it, D = 128 gated with it):
* the launch: 4 + 4 + 1 warps (Triton pads the producer warp's group: 12), shared memory within the 227 KB an
  sm_90a block may use, 512 B of global scratch (four device-built TMA descriptors);
* registers re-balanced with setmaxnreg (``USETMAXREG``), at most 64 B of stack (a few 64-bit values; the
  ``allow_spills`` the variant spec sets is for those);
* the tensor-core work: 64 x BLOCK_N x 16 wgmmas for QK^T and 64 x D x 16 for PV, and the intra-warpgroup overlap --
  a ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (wait for the QK^T while the PV stays in flight) in each consumer.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[1]

_CODE = r"""
import dataclasses, json, re, subprocess, sys, tempfile
from pathlib import Path
root = Path(sys.argv[1]); D = int(sys.argv[2]); gate = sys.argv[3] == "1"; pingpong = sys.argv[4] == "1"
BN = 64  # block_size % BLOCK_N == 0 for the engine's 64-slot blocks
sys.path.insert(0, str(root))
from vkc import discover, toolchain
from vkc.compile import compile_base
from vkc.regen import cuobjdump_resources
spec = {s.name: s for s in discover.load_specs(root, "attn")}[f"prefill.d{D}.{'gate' if gate else 'nogate'}.tma"]
ws = dataclasses.replace(spec, source="prefill_ws.py", entry="prefill_ws_kernel", num_warps=4, num_stages=1,
                         constexprs={**spec.constexprs, "BLOCK_M": 128, "BLOCK_N": BN, "STAGES": 2,
                                     "PINGPONG": pingpong},
                         archs=("sm_90a",), allow_spills=True, overrides={})
c = compile_base(root, ws.for_arch("sm_90a"))
with tempfile.TemporaryDirectory() as d:
    p = Path(d) / "k.cubin"
    p.write_bytes(c.cubin)
    res = cuobjdump_resources(p, c.launch["name"])
    sass = subprocess.run([str(toolchain.triton_bin_dir() / "cuobjdump"), "-sass", str(p)], capture_output=True,
                          text=True, check=True).stdout
ops = {k: len(re.findall(pat, sass)) for k, pat in {
    "qk": rf"HGMMA\.64x{BN}x16\.F32\.BF16", "pv": rf"HGMMA\.64x{D}x16\.F32\.BF16",
    "wait1": r"WARPGROUP\.DEPBAR\.LE gsb0, 0x1", "setmaxnreg": r"USETMAXREG"}.items()}
print(json.dumps({"launch": c.launch, "res": res, "ops": ops}))
"""


def _compile(D: int, gate: bool, pingpong: bool) -> dict:
    from vkc.compile import worker_env

    out = subprocess.run([sys.executable, "-c", _CODE, str(REPO), str(D), str(int(gate)), str(int(pingpong))],
                         capture_output=True, text=True, cwd=REPO, env=worker_env(dict(os.environ)), timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("D,gate,pingpong", [(256, True, False), (256, False, True), (128, True, True)])
def test_prefill_ws_compiles_for_sm90a(D, gate, pingpong):
    r = _compile(D, gate, pingpong)
    launch, res, ops = r["launch"], r["res"], r["ops"]
    assert launch["num_warps"] == 12, launch
    assert launch["shared"] <= 232448, launch  # sm_90a: 227 KB of dynamic shared memory per block
    assert launch["global_scratch_size"] == 512, launch
    assert not launch["launch_pdl"], launch
    assert res["sass_arch"] == "sm_90a" and res["local"] == 0 and res["stack"] <= 64, res
    assert ops["setmaxnreg"] >= 3, ops
    # two consumers, each with two copies of each GEMM (QK^T: first tile + loop, PV: loop + last tile); QK^T
    # has K = D (D / 16 k-steps), PV has K = BLOCK_N = 64 (4)
    assert (ops["qk"], ops["pv"]) == (2 * 2 * D // 16, 2 * 2 * 4), ops
    assert ops["wait1"] >= 2, ops
