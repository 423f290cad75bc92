# session 31, call 2 (HEAD 2622833's kernels): ncu of the block-FP8 and per-tensor CuTe GEMMs, bench_norm on the H200
set -x
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/t timeout 150 bash tools/gpu/run.sh tests "test_gpu_gemm_fp8 and block" > $R/tests-block.txt 2>&1; tail -2 $R/tests-block.txt; rm -rf $O/t
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
n=0
for c in "block 8192 10240 5120 128" "tensor 8192 10240 5120 128" "tensor 8192 10240 5120 256" "block 2048 2048 4096 128"; do
  n=$((n+1))
  timeout 90 $NCU --profile-from-start off --set full --import-source no -o /tmp/ncu-$n -f python3 benchmarks/ncu_case.py gemm_fp8 $c > $R/ncu-$n.log 2>&1
  $NCU -i /tmp/ncu-$n.ncu-rep --page details --print-details all > $R/ncu-$n-details.txt 2>&1
  $NCU -i /tmp/ncu-$n.ncu-rep --page source --csv --print-source sass > $R/ncu-$n-sass.csv 2>&1
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy" $R/ncu-$n-details.txt | head -3
done
timeout 150 python3 benchmarks/bench_norm.py $R/norm.json > $R/norm.log 2>&1; tail -4 $R/norm.log
tar -czf $O/call2.tgz -C $O r; rm -rf $R
