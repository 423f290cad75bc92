"""GPU (H200) memory safety of device-side indices (issue 12): the adversarial cases of tests/bounds_cases.py
(cu_seqlens past the end / negative / decreasing / 2^31 - 1 / cu[N] > T, out-of-range and duplicate slots,
garbage block ids and lengths, token ids, positions) through vkc_runtime.ops with torch CUDA tensors that are
views into larger sentinel-filled buffers: sentinels survive, results are right where the kernels define
them, untouched bytes stay untouched. Each case runs validated (VKC_FASTPATH=0) and through bound calls
(VKC_FASTPATH=1: cases of one op share a layout, so later cases replay the first one's bound call with new
pointers). `bash tools/gpu/run.sh memcheck` runs this file under compute-sanitizer (0 errors expected)."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from tests import bounds_cases as B  # noqa: E402


@pytest.fixture(params=["0", "1"], ids=["validated", "bound"])
def env(request, monkeypatch):
    from vkc_runtime import bound
    monkeypatch.setenv("VKC_FASTPATH", request.param)
    if request.param == "0":
        bound.clear_bound_calls()
    B.ACTIVE.clear()
    yield B.Env("cuda", sync=torch.cuda.synchronize)
    B.ACTIVE.clear()


@pytest.fixture(scope="module")
def ops():
    import vkc_runtime  # noqa: F401
    from types import SimpleNamespace

    from vkc_runtime.ops import act, attn, conv, embedding, gdn, gdn_decode, norm, rope
    return SimpleNamespace(A=attn, G=gdn, GD=gdn_decode, CV=conv, NM=norm, RO=rope, AC=act, EM=embedding)


@pytest.mark.parametrize("case", list(B.PREFILL_CU))
@pytest.mark.parametrize("use_tma", [False, True], ids=["gather", "tma"])
def test_prefill_cu_seqlens(env, ops, case, use_tma):
    B.check_prefill(env, ops.A, case, use_tma, small_grid=True)


@pytest.mark.parametrize("use_tma", [False, True], ids=["gather", "tma"])
def test_prefill_bad_lengths_and_tables(env, ops, use_tma):
    B.check_prefill_bad_lengths(env, ops.A, use_tma)


@pytest.mark.parametrize("splits,fused", [(1, False), (3, False), (3, True)])
@pytest.mark.parametrize("bs", [16, 64], ids=["gather", "tma"])
def test_decode_bad_lengths_and_tables(env, ops, splits, fused, bs):
    B.check_decode(env, ops.A, splits, fused, bs=bs)


def test_reshape_and_cache_slots(env, ops):
    B.check_reshape_and_cache(env, ops.A)


@pytest.mark.parametrize("case", list(B.GDN_CASES))
def test_gdn_prefill_cu_seqlens_and_slots(env, ops, case):
    B.check_gdn(env, ops.G, case)


def test_gdn_decode_slots(env, ops):
    B.check_gdn_decode(env, ops.GD)


@pytest.mark.parametrize("case", list(B.CONV_CASES))
@pytest.mark.parametrize("C,pad", [(128, 0), (40, 0), (40, 8), (1040, 16)])  # (40, 8): aligned rows, C % 16 != 0
def test_conv_prefill_cu_seqlens_and_slots(env, ops, case, C, pad):
    B.check_conv(env, ops.CV, case, C=C, pad=pad)


def test_conv_update_slots(env, ops):
    B.check_conv_update(env, ops.CV)


def test_embedding_ids(env, ops):
    B.check_embedding(env, ops.EM)


def test_rope_positions(env, ops):
    B.check_rope_positions(env, ops.RO)
