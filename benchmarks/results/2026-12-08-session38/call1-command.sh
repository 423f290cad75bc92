# NOT RUN (session 38): the device first failed to start, then paused new loans for the rest of the session.
# For the next session: carry [".whl", "build/carry"], with build/carry/ws-roots.tgz made by this folder's
# variants.py (its header says how). Every step has a timeout: a hung kernel (the warp-specialised prefill's
# mbarrier protocol, modelled on CPU by tests/test_attn_prefill_ws_protocol.py) must not eat the call.
# In priority order:
#  1. the attention prefill GPU tests (mixed varlen batches vs float64, long single sequences, graph capture on
#     any stream) and the prefill bounds cases with roots WSG and WSP (the Gluon kernel in place of the sm_90a
#     TMA prefill), then memcheck of WSG's prefill bounds cases;
#  2. bench_attn prefill (24/4 and 16/2 x 256, T 1024..32768, cuDNN and FLASH in the same process) for HEAD, WSG,
#     WSP;
#  3. ncu of the prefill at 24/4 x 8192 for HEAD and WSG;
#  4. session 37's unrun call 3: the gather decode kernels under a 32768-token table; on an H200 the 35B-A3B engine
#     at B = 1 (bf16 / FP8 / NVFP4) and the MoE block at M = 1.
NAME=call1; source tools/gpu/call_prelude.sh
mkdir -p build/var && tar -xzf build/carry/ws-roots.tgz -C build/var && fill_root WSG WSP
root() { env VKC_ARTIFACT_ROOT=$PWD/build/var/$1 "${@:2}"; }
for V in WSG WSP; do
  root $V timeout 120 python3 -m pytest -q -p no:cacheprovider -m "gpu and not peer" tests/gpu/test_gpu_attn.py \
    tests/gpu/test_gpu_bounds.py tests/gpu/test_gpu_capture.py -k "prefill" > $R/tests-$V.txt 2>&1; snap
done
step tests
mkdir -p /tmp/m; VKC_ARTIFACT_ROOT=$PWD/build/var/WSG VKC_REUSE_BUILD=1 OUT=/tmp/m \
  MEMCHECK_TESTS=tests/gpu/test_gpu_bounds.py MEMCHECK_TIMEOUT=80 timeout 90 bash tools/gpu/run.sh memcheck prefill \
  > $R/memcheck.txt 2>&1; cp /tmp/m/memcheck.log $R/ 2>/dev/null; step memcheck
for V in HEAD WSG WSP; do
  if [ $V = HEAD ]; then e=env; else e="root $V"; fi
  BENCH_ATTN=prefill $e timeout 120 python3 benchmarks/bench_attn.py $R/attn-prefill-$V.json > $R/attn-prefill-$V.txt 2>&1
  snap
done
step prefill
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
for V in HEAD WSG; do
  if [ $V = HEAD ]; then e=env; else e="root $V"; fi
  [ $SECONDS -lt 420 ] && $e timeout 60 $NCU --profile-from-start off --section SpeedOfLight --section Occupancy \
    --section WarpStateStats --section ComputeWorkloadAnalysis --section SourceCounters \
    python3 benchmarks/ncu_case.py prefill 24 4 8192 > $R/ncu-prefill-$V.txt 2>&1
done
step ncu
[ $SECONDS -lt 450 ] && ATTN_SHORT_GATHER=only ATTN_SHORT_SPLITS="4 8 16 32" \
  ATTN_SHORT_CASES="1x100 4x100 4x1000 16x1000 16x4096 4x8000 16x30000 1x30000" timeout 100 \
  python3 benchmarks/explore_attn_short.py $R/attn-gather.json > $R/attn-gather.txt 2>&1
step gather
if grep -q H200 $R/gpu.txt; then
  eng() {  # eng QUANT
    local n=engine-$1-b1-$SECONDS
    VKC_BENCH=1 timeout 60 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant $1 --batches 1 --prefill 64 \
      --long-prefill 0 --steps 32 --timeline --out $R/$n.json > $R/$n.txt 2>&1
    snap
  }
  [ $SECONDS -lt 480 ] && eng none; [ $SECONDS -lt 500 ] && eng fp8; [ $SECONDS -lt 520 ] && eng nvfp4
  [ $SECONDS -lt 540 ] && VKC_BENCH_PATH_MS=1 timeout 30 python3 benchmarks/bench_moe.py $R/moe-paths.json paths \
    > $R/moe-paths.txt 2>&1
fi
step all
