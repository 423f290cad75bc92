# session 37, call 1 (carry [".whl"]), HEAD's artifacts. Issue targets on whatever card comes, then the attention
# decode split probe. In priority order (later steps guarded by the call's clock):
#   35B-A3B engine at B = 1: bf16, FP8, NVFP4 (timeline), bf16 at B = 4 -> attention decode under the engine's
#   32768-token table (explore_attn_short.py, TMA kernels, per-kernel times from torch.profiler) at
#   B = 1 / 4 at 100-1000 keys -> the MoE block at M = 1 (bf16 decode path, FP8) -> session 36's call 3 cases (long
#   contexts, B 1-16) -> the 27B FP8 engine at B = 1 if time is left.
NAME=call1; source tools/gpu/call_prelude.sh
eng() {  # eng SHAPE QUANT BATCHES TIMEOUT
  VKC_BENCH=1 timeout $4 python3 benchmarks/bench_engine.py --shape $1 --quant $2 --batches $3 --prefill 64 \
    --long-prefill 0 --steps 32 --timeline --out $R/engine-$1-$2-b${3//,/-}.json > $R/engine-$1-$2-b${3//,/-}.txt 2>&1
  snap
}
eng 35b-a3b none 1,4 70
eng 35b-a3b fp8 1 50
eng 35b-a3b nvfp4 1 50
step engine35
ATTN_SHORT_PROFILE=1 ATTN_SHORT_GATHER=0 ATTN_SHORT_SPLITS="2 4 8 16 32" ATTN_SHORT_CASES="4x100 4x1000 1x100" \
  timeout 60 python3 benchmarks/explore_attn_short.py $R/attn-short-prof.json > $R/attn-short-prof.txt 2>&1; snap
[ $SECONDS -lt 400 ] && VKC_BENCH_PATH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-paths.json paths \
  > $R/moe-paths.txt 2>&1
[ $SECONDS -lt 420 ] && VKC_BENCH_MS=1 timeout 40 python3 benchmarks/bench_moe.py $R/moe-fp8.json fp8 > $R/moe-fp8.txt 2>&1
step moe
(while sleep 20; do snap; done) &  # the probe prints each row as it goes
ATTN_SHORT_GATHER=0 ATTN_SHORT_SPLITS="4 8 16 32" ATTN_SHORT_CASES="4x8000 4x30000 8x1000 8x8000 8x30000 16x1000 16x30000 1x30000 2x1000 2x30000" \
  timeout $((560 - SECONDS)) python3 benchmarks/explore_attn_short.py $R/attn-long.json > $R/attn-long.txt 2>&1; step attn
kill %1 2>/dev/null
[ $SECONDS -lt 530 ] && eng 27b fp8 1 55
step all
