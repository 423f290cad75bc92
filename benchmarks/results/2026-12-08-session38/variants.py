# How session 38's variant roots are built (CPU box, ~3 min): python3 variants.py WSG WSP, from this session's HEAD;
# then, so that call1-command.sh unpacks them into build/var/WSG and build/var/WSP:
#   mkdir -p build/carry && tar -czf build/carry/ws-roots.tgz -C build/var-src \
#     --transform 's#^\(WS[GP]\)/root#\1#' WSG/root WSP/root
# WSG: the sm_90a TMA prefill (D = 256 and 128, gated and not) from the Gluon warp-specialised kernel,
#      kernels_src/attn/prefill_ws.py: a producer warp, two consumer warp groups, the next tile's QK^T issued
#      with this tile's PV; BLOCK_M 128, BLOCK_N 64, 2 stages.
# WSP: WSG with PINGPONG (the two consumer warp groups issue their GEMMs in turn).
import pathlib
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2] / "tools"))
from variant_root import build, replace_once  # noqa: E402

_OLD = """        _t = _PREFILL_TMA_CFG[_d]
        SPECS.append(KernelSpec(
            name=f"prefill.d{_d}.{'gate' if _gate else 'nogate'}.tma", source="prefill.py", entry="prefill_kernel",
            args=_args(_PREFILL),
            constexprs={"D": _d, "HAS_GATE": _gate, "SEQ_CHUNK": 128, "TMA": True, **_t["constexprs"]},
            num_warps=_t["num_warps"], num_stages=_t["num_stages"], archs=_TMA_ARCHS))"""
_NEW = """        _t = None
        SPECS.append(KernelSpec(
            name=f"prefill.d{_d}.{'gate' if _gate else 'nogate'}.tma", source="prefill_ws.py",
            entry="prefill_ws_kernel", args=_args(_PREFILL),
            constexprs={"D": _d, "HAS_GATE": _gate, "SEQ_CHUNK": 128, "TMA": True, "BLOCK_M": 128,
                        "BLOCK_N": 64, "STAGES": 2, "PINGPONG": PINGPONG},
            num_warps=4, num_stages=1, archs=("sm_90a",), allow_spills=True))"""


def ws(pingpong: bool):
    def patch(tree):
        replace_once(tree / "kernels_src/attn/spec.py", _OLD, _NEW.replace("PINGPONG}", f"{pingpong}}}"))
    return patch


for name in sys.argv[1:]:
    assert name in ("WSG", "WSP"), name
    build(name, ws(name == "WSP"), ["attn/prefill.*.tma.cubin"])
