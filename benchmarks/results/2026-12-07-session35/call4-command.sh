# NOT RUN (session 35): the device time left (230 s) was too little to start a machine. Prepared for the next session.
# session 35, call 4: the engines at B = 1 and the MoE block at M = 1 on the card the issues name (H200 if it
# comes), at the tree with this session's FP8 M = 1 GEMV change (e72a418).
set -x
SECONDS=0
O=$OUT; R=/tmp/r; mkdir -p $R
snap() { tar -czf $O/call4.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=/tmp/b timeout 150 bash tools/gpu/run.sh build-only > $R/build.txt 2>&1
echo "build done at $SECONDS" >> $R/times.txt; snap
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0 VKC_BENCH=1
for q in fp8 none nvfp4; do
  timeout 50 python3 benchmarks/bench_engine.py --shape 35b-a3b --quant $q --batches 1 --prefill 64 --long-prefill 0 \
    --steps 32 --timeline --out $R/engine35-$q.json > $R/engine35-$q.txt 2>&1; snap
done
echo "engine35 done at $SECONDS" >> $R/times.txt
VKC_BENCH_MS=1 timeout 60 python3 benchmarks/bench_moe.py $R/moe-fp8.json fp8 > $R/moe-fp8.txt 2>&1; snap
VKC_BENCH_PATH_MS=1 timeout 60 python3 benchmarks/bench_moe.py $R/moe-paths.json paths > $R/moe-paths.txt 2>&1; snap
echo "moe done at $SECONDS" >> $R/times.txt
[ $SECONDS -lt 200 ] && timeout 80 python3 benchmarks/bench_engine.py --shape 27b --quant fp8 --batches 1 --prefill 64 \
  --long-prefill 0 --steps 32 --timeline --out $R/engine27-fp8.json > $R/engine27-fp8.txt 2>&1
echo "all done at $SECONDS" >> $R/times.txt
snap
