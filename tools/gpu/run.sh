#!/usr/bin/env bash
# The one GPU script (run through the device tool on the H200, from the repository root):
#   builds the sm_90a wheel from the working tree (native launcher + sm_90a artifacts only), installs it
#   apart from the source tree, runs `vkc doctor`, the GPU tests and the benchmarks, and writes to $OUT:
#   env.txt (device, import, doctor), build.log, gpu-tests.log and results.json (every benchmark's JSON and the
#   GPU tests' per-case relative errors, <family>_errors.json via tests/gpu/errlog.py, and failures.txt, each
#   failure's report as it happened (tests/gpu/conftest.py), keyed by name;
#   split it with `python tools/gpu/unpack.py results.json benchmarks/results/<dir>`).
#   usage: [BENCHES='gdn attn ...'] bash tools/gpu/run.sh [all|tests|peer-tests|memcheck|bench|tune|ncu] [pytest -k expression]
#   (the -k expression may also come as KEXPR in the environment; the argument wins)
#   memcheck: every GPU test (MEMCHECK_TESTS overrides, e.g. tests/gpu/test_gpu_bounds.py) under compute-sanitizer
#   --tool memcheck, torch's caching allocator off, except (default -k) the host-timing tests (meaningless under the
#   sanitizer) and the large-grid decode tests (their buffers exhaust memory with the sanitizer's shadow memory);
#   ~4 min on the H200; log in $OUT/memcheck.log, the line 'ERROR SUMMARY: N errors' printed
#   ncu: Nsight Compute on the cases in $NCU_CASES (';'-separated argument lists of benchmarks/ncu_case.py,
#   default the 27B GDN prefill at 32k), sections in ncu-<n>.txt (speed of light, occupancy, warp stalls,
#   source-level stall counters); NCU_SOURCE='regex' adds a full-set report of those kernels: every metric
#   (ncu-<n>-details.txt) and per-SASS-instruction counters and stall samples (ncu-<n>-sass.csv)
#   VKC_REUSE_BUILD=1: skip the wheel build when an earlier step of the same device call installed it
#   peer-tests/bench write $OUT/triton-cache.tgz (FLA's compiled + autotuned kernels); copy it to
#   .triton-cache.tgz and carry it so the next call skips FLA's JIT
#   A device call is limited to 10 minutes. H200 times: wheel build ~30 s, the GPU tests without peers ~40 s,
#   the peer comparisons ~2 min cold (FLA's JIT + autotune) / ~25 s with a carried Triton cache, bench_gdn
#   ~2 min, bench_attn ~1 min per part, a tune set ~20 s per candidate; chain steps with VKC_REUSE_BUILD=1
#   and a separate OUT per step (a call returns at most ~8 files).
#   The device has no network and no jsonschema, which vkc_runtime's plan cache needs once it reads its file (the
#   engine tests and bench_engine do): carry its wheels in .whl/ (git-ignored), e.g. `pip download --only-binary=:all:
#   --python-version 3.12 --platform manylinux2014_x86_64 -d .whl jsonschema` minus typing_extensions (the device
#   has one), and run with carry [".whl"]; env.txt says whether it is importable.
set -uo pipefail
WHAT=${1:-all}
KEXPR=${2:-${KEXPR:-}}  # the pytest -k expression: the second argument, else the environment
OUT=${OUT:-/tmp/vkc-gpu-out}
WORK=/tmp/vkc-work
mkdir -p "$OUT"; rm -rf "$WORK"; mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
# kernels compile for the GPU here: tests/conftest.py defaults TRITON_INTERPRET=1 for the CPU suite, which would
# run every Triton peer (FLA) in the interpreter
export TRITON_INTERPRET=0
# one Triton cache for the whole call (peers' JIT + autotune results); one carried from an earlier call
# (.triton-cache.tgz, git-ignored) is unpacked first, and peer-tests/bench pack it back into $OUT
export TRITON_CACHE_DIR=/tmp/vkc-triton-cache
mkdir -p "$TRITON_CACHE_DIR"
if [ -f .triton-cache.tgz ] && [ "${VKC_REUSE_BUILD:-0}" != 1 ]; then
  tar -xzf .triton-cache.tgz -C "$TRITON_CACHE_DIR" && echo "Triton cache: $(du -sh "$TRITON_CACHE_DIR" | cut -f1) unpacked"
fi
REPO=$(pwd)
SITE=/tmp/vkc-site
ENV_TXT="$OUT/env.txt"
rc=0
merge() {  # every result so far -> $OUT/results.json (so a run cut short still returns what it measured)
python3 - "$WORK" "$OUT/results.json" <<'PY'
import json, pathlib, sys
work, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
res = {}
for f in sorted(work.iterdir()):
    txt = f.read_text()
    try:
        res[f.name] = json.loads(txt)
    except ValueError:
        res[f.name] = [json.loads(l) for l in txt.splitlines() if l.strip()] if f.suffix == ".jsonl" else txt
out.write_text(json.dumps(res, indent=1))
print("results.json:", ", ".join(res))
PY
}

echo "== device"; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$ENV_TXT"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$ENV_TXT"

if [ "${VKC_REUSE_BUILD:-0}" = 1 ] && [ -d "$SITE/vkc_runtime" ]; then  # a second step of the same device call
  echo "== reusing the wheel installed in $SITE"
else
  echo "== build the sm_90a wheel (no network: --no-build-isolation)"
  rm -rf /tmp/vkc-dist "$SITE"
  if ! VKC_ARCHES=sm_90a python3 -m pip wheel -q --no-build-isolation --no-deps -w /tmp/vkc-dist . > "$OUT/build.log" 2>&1; then
    tail -40 "$OUT/build.log"; echo "wheel build FAILED"; exit 1
  fi
  ls -l /tmp/vkc-dist | tee -a "$OUT/build.log"
  python3 -m pip install -q --no-deps --no-index --target "$SITE" /tmp/vkc-dist/vkc-*.whl || exit 1
fi
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
from vkc_runtime import native
print("native launcher:", native.native_available(), native.native_reason() or "")
try:
    import jsonschema  # noqa: F401 - the plan cache's file reader (carried in .whl/)
    print("jsonschema importable from", jsonschema.__file__)
except ImportError:
    print("WARNING: jsonschema not importable: the engine tests / bench_engine will fail (carry .whl/, see above)")
try:
    import fla
    print("peer fla", getattr(fla, "__version__", "?"), "from", fla.__file__)
except Exception as e:
    print("peer fla not importable:", e)
PY
python3 -m vkc_cli doctor 2>&1 | tee -a "$ENV_TXT"; echo "doctor rc=${PIPESTATUS[0]}" | tee -a "$ENV_TXT"

if [ "$WHAT" = tests ] || [ "$WHAT" = all ] || [ "$WHAT" = peer-tests ]; then
  # `tests`/`all`: every GPU test but the peer comparisons (FLA JIT-compiles for minutes on first use);
  # `peer-tests`: only those (pytest marker `peer`; carry .whl)
  if [ "$WHAT" = peer-tests ]; then
    MEXPR="gpu and peer"
    # a per-test limit (pytest-timeout) dumps every thread's stack if one peer call hangs, and lets the next run
    PEER_ARGS="--timeout=${PEER_TEST_TIMEOUT:-240}"
  else
    MEXPR="gpu and not peer"
  fi
  echo "== GPU tests (-m '$MEXPR')"
  VKC_BENCH_OUT="$WORK/runtime_bench.jsonl" VKC_ERR_DIR="$WORK" timeout "${TEST_TIMEOUT:-540}" python3 -m pytest -v -rs -p no:cacheprovider \
    --durations=20 ${PEER_ARGS:-} -m "$MEXPR" tests/gpu ${KEXPR:+-k "$KEXPR"} > "$OUT/gpu-tests.log" 2>&1
  trc=$?; grep -E "PASSED|FAILED|ERROR|SKIPPED" "$OUT/gpu-tests.log" | grep -v PASSED | tail -30; tail -3 "$OUT/gpu-tests.log"
  [ $trc -eq 0 ] || rc=1
  merge > /dev/null
fi
if [ "$WHAT" = memcheck ]; then
  # every device access of the kernels checked against the allocations; a cached torch block would hide an access
  # past a tensor that stays inside the block, so torch allocates each tensor by itself here. API errors are not
  # counted (probes of optional driver features report some); memory errors are.
  CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  MT=${MEMCHECK_TESTS:-tests/gpu}
  KEXPR=${KEXPR:-not host_time and not large_grid}
  echo "== compute-sanitizer memcheck ($CS) over $MT"
  # shellcheck disable=SC2086
  PYTORCH_NO_CUDA_MEMORY_CACHING=1 timeout "${MEMCHECK_TIMEOUT:-540}" "$CS" --tool memcheck --report-api-errors no \
    --print-limit 200 python3 -m pytest -v -rs -p no:cacheprovider -m "gpu and not peer" $MT ${KEXPR:+-k "$KEXPR"} \
    > "$OUT/memcheck.log" 2>&1
  mrc=$?
  grep -E "FAILED|ERROR |passed|failed" "$OUT/memcheck.log" | grep -v PASSED | tail -20
  summary=$(grep -E "ERROR SUMMARY: [0-9]+ error" "$OUT/memcheck.log" | tail -1 | sed 's/^=* *//')
  if [ -n "$summary" ]; then
    echo "memcheck: $summary (pytest under the sanitizer rc=$mrc)"
    case "$summary" in "ERROR SUMMARY: 0 errors"*) ;; *) rc=1 ;; esac
  else
    echo "memcheck: ERROR SUMMARY: missing (the sanitizer did not finish, rc=$mrc)"; rc=1
  fi
  [ $mrc -eq 0 ] || rc=1
fi
if [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then
  echo "== benchmarks"
  for b in ${BENCHES:-gdn gdn_decode attn norm gemm gemm_fp8 gemm_triton gemv nvfp4_mma sample moe moe_grouped launch coldstart coldstart_gdn}; do
    [ -f "benchmarks/bench_$b.py" ] || continue
    echo "-- bench_$b"
    timeout "${BENCH_TIMEOUT:-240}" python3 "benchmarks/bench_$b.py" "$WORK/$b.json" 2>&1 | tail -45 || rc=1
    merge > /dev/null
  done
fi
if [ "$WHAT" = peer-tests ] || [ "$WHAT" = bench ] || [ "$WHAT" = all ]; then  # FLA's JIT + autotune, for the next call
  tar -czf "$OUT/triton-cache.tgz" -C "$TRITON_CACHE_DIR" . && ls -l "$OUT/triton-cache.tgz"
fi
if [ "$WHAT" = tune ]; then
  # candidates come from `vkc tune build ... --out build/tune/<name>` on the CPU box (carry build/tune); the
  # benchmark is benchmarks/tune_<family>.py, the family read from the candidates' candidate.json
  for d in build/tune/*/; do
    name=$(basename "$d")
    fam=$(python3 -c "import glob, json, sys; print(json.load(open(sorted(glob.glob(sys.argv[1] + '*/candidate.json'))[0]))['family'])" "$d") || continue
    echo "== vkc tune run: $name ($fam)"
    python3 -m vkc_cli tune run "$d" --bench "benchmarks/tune_$fam.py" --out "$WORK/tune_$name.json" 2>&1 | tail -20 || rc=1
    merge > /dev/null
  done
fi
if [ "$WHAT" = ncu ]; then
  NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  n=0
  IFS=';' read -ra cases <<< "${NCU_CASES:-gdn 32768 16 48}"
  for c in "${cases[@]}"; do
    n=$((n + 1)); echo "== ncu: $c"
    # shellcheck disable=SC2086
    timeout "${BENCH_TIMEOUT:-240}" "$NCU" --profile-from-start off --target-processes all \
      --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
      --section SchedulerStats --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
      --section SourceCounters ${NCU_ARGS:-} python3 benchmarks/ncu_case.py $c > "$OUT/ncu-$n.txt" 2>&1 || rc=1
    grep -E "^  [a-z_]+.*\(|Duration|Registers Per|Achieved Occupancy|Warp Cycles Per Issued|Stall" "$OUT/ncu-$n.txt" | head -60
    if [ -n "${NCU_SOURCE:-}" ]; then  # kernels (regex) to profile in full: every stall reason, per-SASS-line counters
      # shellcheck disable=SC2086
      timeout "${BENCH_TIMEOUT:-240}" "$NCU" --profile-from-start off --target-processes all --set full \
        --kernel-name "regex:$NCU_SOURCE" -o "/tmp/ncu-rep-$n" -f python3 benchmarks/ncu_case.py $c > /dev/null 2>&1 || rc=1
      "$NCU" -i "/tmp/ncu-rep-$n.ncu-rep" --page details --print-details all > "$OUT/ncu-$n-details.txt" 2>&1
      "$NCU" -i "/tmp/ncu-rep-$n.ncu-rep" --page source --csv --print-source sass > "$OUT/ncu-$n-sass.csv" 2>&1
      ls -l "$OUT"/ncu-$n-*
    fi
  done
fi
merge
exit $rc
