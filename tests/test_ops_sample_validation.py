"""The sampler ops refuse bad input before any launch, pick the specialization (dtype, alignment), and pass
exactly the argument list each compiled kernel declares (checked against the committed sm_90a manifest)."""
from __future__ import annotations

import numpy as np
import pytest

from tests.ops_fakes import Dev, Recorder, declared_bases
from vkc_runtime.ops import sample as S
from vkc_runtime.ops._check import OpError

F32, I32, I64, BF16 = "<f4", "<i4", "<i8", "<V2"


@pytest.fixture()
def rec(monkeypatch):
    r = Recorder(declared=declared_bases(S))
    monkeypatch.setattr(S, "get_kernel", r)
    return r


def args(B, V, dtype=F32, **kw):
    return Dev((B, V), dtype, **kw), Dev((B, S.NF), F32), Dev((B, S.NI), I64)


def test_picks_dtype_and_alignment(rec):
    out = Dev((4,), I32)
    S.sample(*args(4, 248320), out=out)
    S.sample(*args(4, 248320, BF16), out=out)
    S.sample(*args(4, 1000), out=out)                                  # V % 16 != 0 -> .any
    S.sample(*args(4, 248320, offset=1), out=out)                      # misaligned logits -> .any
    S.sample(*args(4, 248320), counts=Dev((9, 248320), I32), out=out)
    S.sample(*args(4, 248320), counts=Dev((9, 248320), I32, strides=(248328, 1)), out=out)  # counts stride
    assert [c[0] for c in rec.calls] == ["sample.row.f32.a16", "sample.row.bf16.a16", "sample.row.f32.any",
                                         "sample.row.f32.any", "sample.row.f32.a16", "sample.row.f32.any"]
    assert all(c[1] == (4, 1, 1) for c in rec.calls)
    a = rec.calls[0][2]
    # stride, V, stride_c, num_slots, n_top, stride_top, want_lp, n_slices (0: no workspace, the serial pass 1),
    # span (ops.sample.SPAN, read only with slices)
    assert a[9:] == (248320, 248320, 0, 0, 0, 0, 0, 0, S.SPAN)
    assert rec.calls[4][2][11:13] == (248320, 9)


def test_workspace_runs_the_row_statistics_first(rec):
    B, V = 4, 248320
    n = -(-V // S.SPAN)
    assert n == 31
    ws = Dev((B * n * 4,), F32)  # what sample_workspace(B, V) allocates
    lg, fp, ip = args(B, V, BF16)
    S.sample(lg, fp, ip, out=Dev((B,), I32), workspace=ws)
    (b1, g1, a1), (b2, g2, a2) = rec.calls
    assert (b1, g1) == ("sample.stats.bf16.a16", (B, n, 1)) and (b2, g2) == ("sample.row.bf16.a16", (B, 1, 1))
    assert a1[4] == a2[8] == ws.__cuda_array_interface__["data"][0] and a1[5:] == (V, V, 0, 0, S.SPAN)
    assert a2[-2:] == (n, S.SPAN)  # n_slices, span
    rec.calls.clear()
    with pytest.raises(OpError, match="workspace must be"):  # too small for B rows
        S.sample(*args(B + 1, V), out=Dev((B + 1,), I32), workspace=ws)
    assert rec.calls == [] and S.sample_workspace(2, S.SPAN * S.SMAX + 1) is None


def test_optional_outputs(rec):
    lg, fp, ip = args(3, 512)
    S.sample(lg, fp, ip, out=Dev((3,), I32), logprobs=Dev((3,), F32), top_logprobs=Dev((3, 20), F32),
             top_ids=Dev((3, 20), I32))
    assert rec.calls[0][2][-5:] == (20, 20, 1, 0, S.SPAN)  # n_top, stride_top, want_lp, n_slices, span


@pytest.mark.parametrize("bad, msg", [
    (dict(logits=Dev((4, 100), "<f2")), "logits must be float32"),
    (dict(fparams=Dev((4, 6), F32)), "fparams has shape"),
    (dict(iparams=Dev((4, 4), I32)), "iparams must be int64"),
    (dict(fparams=Dev((4, 8), F32, strides=(16, 1))), "contiguous"),
    (dict(out=Dev((5,), I32)), "out has shape"),
    (dict(out=Dev((4,), I64)), "out must be int32"),
    (dict(counts=Dev((3, 99), I32)), "counts has shape"),
    (dict(top_logprobs=Dev((4, 21), F32), top_ids=Dev((4, 21), I32)), "1..20"),
    (dict(top_logprobs=Dev((4, 5), F32)), "together"),
    (dict(logprobs=Dev((4,), I32)), "logprobs must be float32"),
])
def test_refuses_bad_inputs(rec, bad, msg):
    kw = dict(logits=Dev((4, 100), F32), fparams=Dev((4, 8), F32), iparams=Dev((4, 4), I64), out=Dev((4,), I32))
    kw.update(bad)
    with pytest.raises(OpError, match=msg):
        S.sample(kw.pop("logits"), kw.pop("fparams"), kw.pop("iparams"), **kw)
    assert rec.calls == []


def test_count_ops(rec):
    counts = Dev((6, 1000), I32)
    S.reset_counts(counts, Dev((3,), I64))
    S.add_prompt_tokens(counts, Dev((2500,), I32), Dev((2500,), I64))
    S.add_output_tokens(counts, Dev((7,), I32), Dev((7, 4), I64))
    (b0, g0, a0), (b1, g1, a1), (b2, g2, a2) = rec.calls
    assert (b0, g0, a0[2:]) == ("sample.reset", (3, 1, 1), (1000, 1000, 6))
    assert (b1, g1, a1[3:]) == ("sample.counts", (3, 1, 1), (2500, 1000, 1000, 6, 0, 1, 1))
    assert (b2, g2, a2[3:]) == ("sample.counts", (1, 1, 1), (7, 1000, 1000, 6, S.I_SLOT, S.NI, 0))
    with pytest.raises(OpError, match="slots must be int64"):
        S.add_prompt_tokens(counts, Dev((4,), I32), Dev((4,), I32))
    with pytest.raises(OpError, match="slots has shape"):
        S.add_prompt_tokens(counts, Dev((4,), I32), Dev((5,), I64))
    with pytest.raises(OpError, match="iparams has shape"):
        S.add_output_tokens(counts, Dev((4,), I32), Dev((5, 4), I64))


def test_host_params_layout():
    fp, ip = S.host_params(3, temperature=[0.0, 0.7, 1.0], top_k=40, top_p=0.9, min_p=0.05, repetition_penalty=1.1,
                           presence_penalty=0.2, frequency_penalty=0.3, seed=[1, 2, 3], step=7, slot=[0, -1, 5])
    assert fp.dtype == np.float32 and fp.shape == (3, S.NF) and ip.dtype == np.int64 and ip.shape == (3, S.NI)
    assert fp[1, S.F_TEMPERATURE] == np.float32(0.7) and fp[2, S.F_TOP_P] == np.float32(0.9)
    assert fp[0, S.F_MIN_P] == np.float32(0.05) and fp[0, S.F_REPETITION] == np.float32(1.1)
    assert fp[0, S.F_PRESENCE] == np.float32(0.2) and fp[0, S.F_FREQUENCY] == np.float32(0.3)
    assert ip[:, S.I_TOP_K].tolist() == [40] * 3 and ip[:, S.I_SEED].tolist() == [1, 2, 3]
    assert ip[:, S.I_STEP].tolist() == [7] * 3 and ip[:, S.I_SLOT].tolist() == [0, -1, 5]
    with pytest.raises(OpError, match="3 values"):
        S.host_params(3, seed=[1, 2])
