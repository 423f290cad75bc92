# NOT RUN (session 36): the device refused the start; too little device time was left to try again.
# session 36, call 3 (carry [".whl"]): attention decode under the engine's 32768-token table at B 4 / 8 / 16 and
# long contexts (explore_attn_short.py, TMA kernels), to see whether capping the split count at B x Hkv > 2 loses
# there (call 1: the rule is ~2x the best at B = 4 with 100-1000 keys).
NAME=call3; source tools/gpu/call_prelude.sh
(while sleep 20; do snap; done) &  # the probe prints each row as it goes
ATTN_SHORT_GATHER=0 ATTN_SHORT_SPLITS="4 8 16 32" ATTN_SHORT_CASES="4x8000 4x30000 8x1000 8x8000 8x30000 16x1000 16x30000 1x30000 2x1000 2x30000" \
  timeout 170 python3 benchmarks/explore_attn_short.py $R/attn-long.json > $R/attn-long.txt 2>&1; step all
