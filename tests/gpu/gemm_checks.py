"""The GEMM families' output check (gemm, gemm_fp8, gemm_fp4): vs a float64 reference, globally and per row, with
the poisoned guard of a padded output buffer (:func:`guarded_out`) untouched; the errors are recorded under the
family. Also the tests' seeded CUDA generator (:func:`gen`)."""
from __future__ import annotations

from tests.gpu.errlog import record

TOL = 1e-2          # global relative error (bf16 output rounding alone gives ~2e-3)
ROW_TOL = 2e-2      # worst row


def check_gemm_out(family: str, out, ref, buf, what: str, bound=None) -> None:
    """``out`` [m, n] (a view into ``buf`` [m + 2, >= n], NaN-poisoned outside it, or None) vs ``ref`` float64.
    ``bound`` (float64 |A| @ |B|^T, optional) floors each row's norm in the row check at 1e-3 of the bound
    row's: a row whose products cancel to almost nothing (random data over many binades: at N = 8 one run on
    the H200 had a row at 4e-2 of its own norm, six reruns of the same test passed; fp32 summation on such a
    row is of that order) is judged against its summation error scale, while a wrong constant (errors of the
    order of the row itself) still fails."""
    import torch  # noqa: PLC0415 - GPU tests only

    m, n = out.shape
    o = out.double()
    assert not torch.isnan(o).any(), f"{what}: NaN in the output (unwritten or bad math)"
    err = float(torch.linalg.norm(o - ref) / torch.linalg.norm(ref))
    den = torch.linalg.norm(ref, dim=1)
    if bound is not None:
        den = torch.maximum(den, 1e-3 * torch.linalg.norm(bound, dim=1))
    row_err = float((torch.linalg.norm(o - ref, dim=1) / den.clamp_min(1e-30)).max())
    if buf is not None:
        outside = torch.cat([buf[0], buf[-1], buf[1:m + 1, n:].reshape(-1)])
        assert torch.isnan(outside.float()).all(), f"{what}: wrote outside out"
    record(family, what=what, rel_err=err, worst_row=row_err)
    assert err < TOL, f"{what}: rel err {err:.3e}"
    assert row_err < ROW_TOL, f"{what}: worst row rel err {row_err:.3e}"


def guarded_out(m, n, pad=8):
    """A NaN-poisoned [m, n] view with a poisoned guard row above and below and ``pad`` poisoned columns on the
    right (row stride n + pad, a multiple of 8: 16-byte aligned rows); :func:`check_gemm_out` checks the guard."""
    import torch  # noqa: PLC0415 - GPU tests only

    buf = torch.full((m + 2, n + pad), float("nan"), device="cuda", dtype=torch.bfloat16)
    return buf, buf[1:m + 1, :n]


def gen(seed=None):
    """A CUDA generator on ``seed`` or a fresh one."""
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    g = torch.Generator(device="cuda")
    g.manual_seed(int(np.random.SeedSequence().entropy % 2**63) if seed is None else seed)
    return g
