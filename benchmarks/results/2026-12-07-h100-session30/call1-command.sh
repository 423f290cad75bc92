set -x
O=$OUT
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $O/gpu.txt
OUT=$O/t timeout 190 bash tools/gpu/run.sh tests "test_gpu_gemm.py or test_gpu_gemm_fp8" > $O/tests.txt 2>&1; tail -4 $O/tests.txt
export PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site TRITON_INTERPRET=0
ab() { if [ $1 = old ]; then env VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=$PWD/build/ab-old "${@:2}"; else "${@:2}"; fi; }
for r in new old; do ab $r timeout 110 python3 benchmarks/bench_gemm_fp8.py $O/fp8-$r.json 2048,8192 > $O/fp8-$r.log 2>&1; tail -2 $O/fp8-$r.log; done
for r in new old; do ab $r timeout 60 python3 benchmarks/bench_gemm.py $O/bf16-$r.json 2048,8192 > $O/bf16-$r.log 2>&1; tail -2 $O/bf16-$r.log; done
timeout 60 python3 -c "import sys; from vkc_cli import main; sys.argv=['vkc','tune','plans','--write-defaults','$O/sm_90a-plan.json']; main()" > $O/tune.log 2>&1; tail -3 $O/tune.log
