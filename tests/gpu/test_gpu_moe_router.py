"""GPU (H200) checks of the MoE router with each logits kernel forced (route.logits.small and .large, through
ops/moe/common.py SMALL_M), at Qwen3.6-35B-A3B's router shape: H = 2048, E = 256 routed experts, top-8, the
shared expert's gate folded in as pick k (expert id 256), bf16 x and weights, for M in {64, 100, 128, 257,
1000, 2048}. route.logits.large once gave wrong, run-to-run different ids at M >= 100 on sm_90a (a race in
Triton's pipelining of its K loop: kernels_src/moe/route.py, "Pipelining").

- ids vs a float64 router: pick j's float64 logit equals the reference's j-th largest within the logits'
  noise (the pick's plus the row's largest), so picks may differ from the reference only by swapping logits
  that close; rows without such near-ties among their top k + 1 must match exactly (near-tied rows are counted
  and printed). The noise is 2^-16 * sum_i |x_i w_i| per logit: bf16 operands multiply exactly, so it is the
  fp32 accumulation error, which stays far below that (a random walk over H = 2048 terms: ~2^-18.5 of the sum
  of magnitudes; one ulp of the accumulator lost per 16-deep MMA step, 128 steps: 2^-17); the worst case of
  round-to-nearest, H * 2^-24 = 2^-13, would call most rows near-tied;
- weights vs float64 probabilities of the picked set (renormalised over it), the shared weight
  sigmoid(x . shared_gate_w);
- determinism: the workspace poisoned before each of three runs (validated, bound-call replay, no
  workspace): bitwise equal ids and weights."""
from __future__ import annotations

import pytest

from tests.gpu.test_gpu_moe import router_inputs, run_route

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

E, K, H = 256, 8, 2048
MS = (64, 100, 128, 257, 1000, 2048)
FORCE = {"small": 1 << 30, "large": 0}  # SMALL_M values that send every M to one kernel


@pytest.fixture()
def forced(request):
    """(moe module, size): ops/moe/common.py SMALL_M set so that route takes route.logits.<size>; the logits
    bases the op asks for are recorded in ``asked``."""
    import vkc_runtime  # noqa: F401
    from vkc_runtime.ops import moe
    from vkc_runtime.ops.moe import common, route_ops
    size = request.param
    asked = []
    orig = route_ops.get_kernel

    def recording(base, device=None):
        asked.append(base)
        return orig(base, device=device)
    mp = pytest.MonkeyPatch()
    mp.setattr(common, "SMALL_M", FORCE[size])
    mp.setattr(route_ops, "get_kernel", recording)
    try:
        yield moe, size, asked
    finally:
        mp.undo()


def check_vs_float64(ids, wts, x, gw, sg, renorm, tag):
    xd, wd = x.double(), gw.double()
    logits = xd @ wd.T
    noise = 2.0 ** -16 * (xd.abs() @ wd.abs().T)  # per logit (module docstring)
    nmax = noise.max(1, keepdim=True).values
    ref = torch.sort(logits, dim=-1, descending=True, stable=True)
    got = ids[:, :K].long()
    assert ((got >= 0) & (got < E)).all(), tag
    srt = torch.sort(got, 1).values
    assert (srt[:, 1:] != srt[:, :-1]).all(), f"{tag}: an expert picked twice"
    lg, ng = logits.gather(1, got), noise.gather(1, got)
    dev = (lg - ref.values[:, :K]).abs()
    bad = dev > ng + nmax
    assert not bad.any(), (f"{tag}: rows {bad.any(1).nonzero().flatten()[:8].tolist()} pick experts whose float64 "
                           f"logit is off the reference order by up to {dev.max().item():.4g} (noise bound "
                           f"{(ng + nmax).max().item():.4g})")
    gaps = ref.values[:, :K] - ref.values[:, 1:K + 1]
    tie = (gaps <= 2 * nmax).any(1)
    if tie.any():
        print(f"{tag}: {int(tie.sum())} of {x.shape[0]} rows with near-tied logits among the top {K + 1}")
    assert torch.equal(got[~tie], ref.indices[~tie, :K]), f"{tag}: ids differ in rows without near-ties"
    p = torch.softmax(logits, dim=-1).gather(1, got)
    w = p / p.sum(1, keepdim=True) if renorm else p
    torch.testing.assert_close(wts[:, :K].double(), w, rtol=1e-4, atol=1e-6, msg=lambda m: f"{tag}: {m}")
    if sg is not None:
        assert (ids[:, K] == E).all(), tag
        torch.testing.assert_close(wts[:, K].double(), torch.sigmoid(xd @ sg.double()[0]), rtol=1e-4, atol=1e-6,
                                   msg=lambda m: f"{tag} shared: {m}")


@pytest.mark.parametrize("forced", ["small", "large"], indirect=True)
@pytest.mark.parametrize("M", MS)
@pytest.mark.parametrize("renorm,shared", [(True, True), (False, False)])
def test_router_forced_kernel_vs_float64_and_deterministic(forced, M, renorm, shared):
    moe, size, asked = forced
    x, gw, sg = router_inputs(M, 1000 + M)
    sg = sg if shared else None
    ws = moe.moe_workspace(M, E, K, H, 512, shared=shared)  # sized with the forced kernel's split rule
    runs = []
    for i, w in enumerate((ws, ws, None)):  # validated, bound-call replay, a fresh scratch per call
        ws.part.fill_bytes(0xFF)
        asked.clear()
        runs.append(run_route(moe, x, gw, K, renorm, sg, w))
        if i != 1:
            logits = [b for b in asked if ".route.logits." in b]
            assert logits == [f"moe.route.logits.{size}"], asked
    tag = f"{size} M={M}"
    for ids, wts in runs[1:]:
        assert torch.equal(ids, runs[0][0]), f"{tag}: ids differ between runs"
        assert torch.equal(wts.view(torch.int32), runs[0][1].view(torch.int32)), f"{tag}: weights differ"
    check_vs_float64(*runs[0], x, gw, sg, renorm, tag)
