# NOT RUN (session 37): the device refused the start, then too little device time was left to start one.
# session 37, call 3 (carry [".whl"]), at the tree of session 37's change. The gather decode kernels (the archs
# without TMA decode: sm_80/86/89/120a/121a; forced here by a workspace without the TMA scratch) under a
# 32768-token table: does their fused-merge rule lose at short contexts too? Then, only on an H200 (the card the
# issues name), as far as the call's clock allows: the 35B-A3B engine at B = 1 (bf16, FP8, NVFP4) and the MoE
# block at M = 1.
NAME=call3; source tools/gpu/call_prelude.sh
ATTN_SHORT_GATHER=only ATTN_SHORT_SPLITS="4 8 16 32" \
  ATTN_SHORT_CASES="1x100 4x100 4x1000 16x1000 16x4096 4x8000 16x30000 1x30000" timeout 150 \
  python3 benchmarks/explore_attn_short.py $R/attn-gather.json > $R/attn-gather.txt 2>&1; step gather
if grep -q H200 $R/gpu.txt; then
  eng() {  # eng QUANT BATCHES EXTRA...
    local n=engine-$1-b${2//,/-}-$SECONDS q=$1 b=$2; shift 2
    VKC_BENCH=1 timeout 60 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant $q --batches $b --prefill 64 \
      --long-prefill 0 --steps 32 --timeline "$@" --out $R/$n.json > $R/$n.txt 2>&1
    snap
  }
  [ $SECONDS -lt 220 ] && eng none 1; [ $SECONDS -lt 250 ] && eng fp8 1; [ $SECONDS -lt 270 ] && eng nvfp4 1
  step engine
  [ $SECONDS -lt 280 ] && VKC_BENCH_PATH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-paths.json paths \
    > $R/moe-paths.txt 2>&1
  [ $SECONDS -lt 290 ] && VKC_BENCH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-fp8.json fp8 > $R/moe-fp8.txt 2>&1
fi
step all
