#!/usr/bin/env bash
# The one GPU script (run through the device tool on the H200, from the repository root):
#   builds the sm_90a wheel from the working tree (native launcher + sm_90a artifacts only), installs it
#   apart from the source tree, runs `vkc doctor`, the GPU tests and the benchmarks, and writes logs and
#   JSON results to $OUT.   usage: bash tools/gpu/run.sh [tests|bench|all|tune]
set -uo pipefail
WHAT=${1:-all}
OUT=${OUT:-/tmp/vkc-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
REPO=$(pwd)
SITE=/tmp/vkc-site
rc=0

# $OUT gets at most 8 files back: build.log env.txt gpu-tests.log runtime_bench.jsonl launch.json coldstart.json
# norm.json (tune mode: tune_<family>.json)
ENV_TXT="$OUT/env.txt"
echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$ENV_TXT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$ENV_TXT"

echo "== build the sm_90a wheel (no network: --no-build-isolation)"
rm -rf /tmp/vkc-dist "$SITE"
if ! VKC_ARCHES=sm_90a python3 -m pip wheel -q --no-build-isolation --no-deps -w /tmp/vkc-dist . > "$OUT/build.log" 2>&1; then
  tail -40 "$OUT/build.log"; echo "wheel build FAILED"; exit 1
fi
ls -l /tmp/vkc-dist | tee -a "$OUT/build.log"
python3 -m pip install -q --no-deps --no-index --target "$SITE" /tmp/vkc-dist/vkc-*.whl || exit 1
export PYTHONPATH="$SITE:$REPO"      # vkc_runtime from the wheel; $REPO only for tests/ and benchmarks/
if ls .whl/*.whl >/dev/null 2>&1; then  # peer packages carried as wheels (e.g. fla-core for GDN comparisons)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/peer-site .whl/*.whl && \
    export PYTHONPATH="$PYTHONPATH:/tmp/peer-site"
fi
python3 - <<'PY' 2>&1 | tee -a "$ENV_TXT"
import sys, time
t0 = time.perf_counter()
import vkc_runtime
dt = time.perf_counter() - t0
print("vkc_runtime from", vkc_runtime.__file__, f"import {dt*1e3:.1f} ms")
bad = [m for m in ("torch", "triton", "cupy", "cutlass") if m in sys.modules]
print("heavy modules imported by vkc_runtime:", bad or "none")
from vkc_runtime import launch
print("native launcher:", getattr(launch, "native_available", lambda: "?")())
PY
(cd /tmp && python3 -X importtime -c "import vkc_runtime" 2>&1 | sort -t'|' -k2 -n | tail -8) | tee -a "$ENV_TXT"
python3 -m vkc.cli doctor 2>&1 | tee -a "$ENV_TXT"; echo "doctor rc=${PIPESTATUS[0]}" | tee -a "$ENV_TXT"

if [ "$WHAT" = tests ] || [ "$WHAT" = all ]; then
  echo "== GPU tests"
  VKC_BENCH_OUT="$OUT/runtime_bench.jsonl" python3 -m pytest -q -rs -p no:cacheprovider tests/gpu 2>&1 \
    | tee "$OUT/gpu-tests.log" | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || rc=1
fi
if [ "$WHAT" = tune ]; then
  # candidates come from `vkc tune build ... --out build/tune/<family>` on the CPU box (carry build/tune)
  for d in build/tune/*/; do
    fam=$(basename "$d"); echo "== vkc tune run: $fam"
    python3 -m vkc.cli tune run "$d" --bench "benchmarks/tune_$fam.py" --out "$OUT/tune_$fam.json" 2>&1 | tail -20 || rc=1
  done
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  echo "== benchmarks"
  python3 benchmarks/bench_launch.py "$OUT/launch.json" 2>&1 | tail -12 || rc=1
  python3 benchmarks/bench_coldstart.py "$OUT/coldstart.json" 2>&1 | tail -20 || rc=1
  python3 benchmarks/bench_norm.py "$OUT/norm.json" 2>&1 | tail -40 || rc=1
fi
exit $rc
