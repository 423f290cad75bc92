# session 32, call 2: the 192x128 block-FP8 tile with its three math warp groups issuing in turn (named barriers; working tree)
# vs call 1's unordered build (build/ab-mid: the branch's committed gemm .so) and main's block kernels (build/ab-old:
# artifacts + main's gemm.py / gemm_fp8.py / bench / ncu_case): GPU tests, A/B/C, ncu; and the gated RMSNorm's
# HEADS_PER_PROG x num_warps candidates (build/tune/gated_*, stripped to the norm family) through `vkc tune run`
set -x
tar -xzf build/carry/ab.tgz; cp -rn build/ab-old/. build/ab-mid/   # ab-mid carries only its gemm .so and manifest
O=$OUT; R=$O/r; mkdir -p $R
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv > $R/gpu.txt
OUT=$O/t timeout 200 bash tools/gpu/run.sh tests "test_gpu_gemm_fp8 or test_gpu_engine_fp8" > $R/tests.txt 2>&1; tail -3 $R/tests.txt
cp $O/t/gpu-tests.log $R/gpu-tests.log; rm -rf $O/t
rm -rf /tmp/vkc-site-old; cp -r /tmp/vkc-site /tmp/vkc-site-old
cp build/ab-old/src/gemm.py build/ab-old/src/gemm_fp8.py /tmp/vkc-site-old/vkc_runtime/ops/
cp build/ab-old/src/bench_gemm_fp8.py benchmarks/bench_gemm_fp8_old.py; cp build/ab-old/src/ncu_case.py benchmarks/ncu_case_old.py
export TRITON_INTERPRET=0
new() { PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site "$@"; }
mid() { PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=$PWD/build/ab-mid "$@"; }
old() { PYTHONPATH=/tmp/vkc-site-old:$PWD:/tmp/peer-site VKC_IMPORT_CHECK=0 VKC_ARTIFACT_ROOT=$PWD/build/ab-old "$@"; }
new timeout 80 python3 benchmarks/bench_gemm_fp8.py $R/fp8-new.json 2048,8192 > $R/fp8-new.log 2>&1; tail -1 $R/fp8-new.log
mid timeout 80 python3 benchmarks/bench_gemm_fp8.py $R/fp8-mid.json 2048,8192 > $R/fp8-mid.log 2>&1; tail -1 $R/fp8-mid.log
old timeout 80 python3 benchmarks/bench_gemm_fp8_old.py $R/fp8-old.json 2048,8192 > $R/fp8-old.log 2>&1; tail -1 $R/fp8-old.log
VKC_IMPORT_CHECK=0 VKC_REUSE_BUILD=1 OUT=$O/tune timeout 200 bash tools/gpu/run.sh tune > $R/tune.txt 2>&1; tail -30 $R/tune.txt; cp $O/tune/results.json $R/tune-results.json
tar -czf $O/call2.tgz -C $O r
NCU=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 100 $NCU --profile-from-start off --set full --import-source no -o /tmp/ncu-1 -f env PYTHONPATH=/tmp/vkc-site:$PWD:/tmp/peer-site python3 benchmarks/ncu_case.py gemm_fp8 block 8192 10240 5120 192x128 > $R/ncu-1.log 2>&1
$NCU -i /tmp/ncu-1.ncu-rep --page details --print-details all > $R/ncu-1-details.txt 2>&1
$NCU -i /tmp/ncu-1.ncu-rep --page source --csv --print-source sass > $R/ncu-1-sass.csv 2>&1
grep -E "Duration|Warp Cycles Per Issued|Issue Slots Busy" $R/ncu-1-details.txt | head -3
tar -czf $O/call2.tgz -C $O r
new timeout 80 python3 benchmarks/bench_gemm_fp8.py $R/fp8-new-2.json 2048,8192 > $R/fp8-new-2.log 2>&1; tail -1 $R/fp8-new-2.log
tar -czf $O/call2.tgz -C $O r; rm -rf $R
