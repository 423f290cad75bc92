# How session 37's variant roots were built (CPU box): python3 variants.py NAME, from this session's HEAD.
# CB: the attention decode merges (decode_combine, and decode_fused's last split) read every split's lse in one
#     vector load first, then only the splits up to the last live one, each partial loaded with its lse rather
#     than after it (cb_patch.py). At a short context under a wide block table most splits are empty: the merge
#     stops at the last live one instead of walking them all.
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tools"))
sys.path.insert(0, str(HERE))
from variant_root import build  # noqa: E402

import cb_patch  # noqa: E402

name = sys.argv[1]
assert name == "CB", name
build(name, cb_patch.patch, ["attn/decode_fused.*.cubin", "attn/decode_combine.*.cubin"])
