# session 31, call 1: block-FP8 scale ring (working tree) vs HEAD 2622833 (build/ab-old): GPU tests, A/B, ncu
set -x
O=$OUT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $O/gpu.txt
OUT=$O/t timeout 240 bash tools/gpu/run.sh tests "test_gpu_gemm.py or test_gpu_gemm_fp8 or test_gpu_engine_fp8" > $O/tests-mixed.txt 2>&1; tail -3 $O/tests-mixed.txt
cp $O/t/gpu-tests.log $O/gpu-tests-mixed.log; rm -rf $O/t
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
ab() { if [ $1 = old ]; then env VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=$PWD/build/ab-old "${@:2}"; else "${@:2}"; fi; }
for r in new old; do ab $r timeout 70 python3 benchmarks/bench_gemm_fp8.py $O/fp8-$r.json 2048,8192 > $O/fp8-$r.log 2>&1; tail -1 $O/fp8-$r.log; done
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
n=0
for c in "new block 8192 10240 5120 128" "old block 8192 10240 5120 128" "new tensor 8192 10240 5120 128"; do
  n=$((n+1)); set -- $c
  ab $1 timeout 90 $NCU --profile-from-start off --set full --import-source no -o /tmp/ncu-$n -f python3 benchmarks/ncu_case.py gemm_fp8 $2 $3 $4 $5 $6 > $O/ncu-$n.log 2>&1
  $NCU -i /tmp/ncu-$n.ncu-rep --page details --print-details all > $O/ncu-$n-details.txt 2>&1
  $NCU -i /tmp/ncu-$n.ncu-rep --page source --csv --print-source sass > $O/ncu-$n-sass.csv 2>&1; gzip $O/ncu-$n-sass.csv
  grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy" $O/ncu-$n-details.txt | head -4
done
ab new timeout 50 python3 benchmarks/bench_gemm.py $O/bf16-new.json 2048,8192 > $O/bf16-new.log 2>&1; tail -1 $O/bf16-new.log
for r in new old; do ab $r timeout 60 python3 benchmarks/bench_gemm_fp8.py $O/fp8-$r-2.json 2048,8192 > $O/fp8-$r-2.log 2>&1; tail -1 $O/fp8-$r-2.log; done
