"""The norm ops refuse bad input before any launch, pick the right specialization, and pass exactly the
argument list each compiled kernel declares (checked against the committed sm_90a manifest)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.ops_fakes import MANIFEST, Dev, Recorder, declared_bases
from vkc_runtime.ops import act as AC, embedding as EM, norm as N, rope as RO
from vkc_runtime.ops._check import OpError


@pytest.fixture()
def rec(monkeypatch):
    r = Recorder(declared=declared_bases(N) | declared_bases(RO) | declared_bases(AC) | declared_bases(EM))
    for m in (N, RO, AC, EM):
        monkeypatch.setattr(m, "get_kernel", r)
    return r


def test_rmsnorm_picks_block_and_variant(rec):
    N.rmsnorm(Dev((7, 5120)), Dev((5120,)), 1e-6, out=Dev((7, 5120)))
    N.rmsnorm(Dev((7, 5120), offset=1), Dev((5120,)), 1e-6, out=Dev((7, 5120)))  # misaligned -> .any
    N.rmsnorm(Dev((3, 1000)), Dev((1000,)), 1e-6, out=Dev((3, 1000)))  # stride 1000 % 16 != 0 -> .any
    assert [c[0] for c in rec.calls] == ["norm.rmsnorm.b8192.a16", "norm.rmsnorm.b8192.any", "norm.rmsnorm.b1024.any"]
    assert rec.calls[0][1] == (7, 1, 1)
    assert rec.calls[0][2][-2:] == (5120, 1e-6)


def test_grids_from_manifest_constexprs(rec):
    N.gated_rmsnorm(Dev((5, 48 * 128)), Dev((5, 48 * 128)), Dev((128,)), out=Dev((5, 48 * 128)))
    RO.qk_norm_rope(Dev((3, 24 * 512)), Dev((3, 4 * 256)), Dev((3,), "<i4"), Dev((256,)), Dev((256,)), 24, 4, 256,
                   q_out=Dev((3, 24, 256)), k_out=Dev((3, 4, 256)))
    AC.silu_mul(Dev((2, 2 * 17408)), out=Dev((2, 17408)))
    EM.embedding(Dev((9,), "<i4"), Dev((1000, 2048)), out=Dev((9, 2048)))
    grids = {c[0]: c[1] for c in rec.calls}
    assert grids["norm.gated_rmsnorm.h128.a16"] == (5, 48 // 8, 1)   # sm_90a tuned: 8 heads a program
    assert grids["rope.qk_norm_rope.d256.r64.a16"] == (1, 24 // 4 + 1, 1)  # 3 tokens, 4 a program (sm_90a's TOK)
    assert grids["act.silu_mul.a16"] == (2, 17, 1)
    assert grids["embedding.embedding.a16"] == (9, 2, 1)


def test_sigmoid_mul_reads_strided_gate(rec):
    T, H, D = 4, 24, 256
    # gate = qg.view(T, H, 2, D)[:, :, 1]: strides (H*2*D, 2*D, 1), offset D
    gate = Dev((T, H, D), strides=(H * 2 * D, 2 * D, 1), offset=D)
    x = Dev((T, H * D))
    AC.sigmoid_mul(x, gate, out=x)
    base, grid, args = rec.calls[0]
    assert base == "act.sigmoid_mul.d256.a16" and grid == (T, H // 4, 1)
    assert args[3:7] == (H * D, H * 2 * D, 2 * D, H * D)


@pytest.mark.parametrize("call, msg", [
    (lambda: N.rmsnorm(Dev((4, 64), "<f4"), Dev((64,)), out=Dev((4, 64))), "x must be bfloat16, got float32"),
    (lambda: N.rmsnorm(Dev((4, 64)), Dev((32,)), out=Dev((4, 64))), "weight has shape (32,)"),
    (lambda: N.rmsnorm(Dev((4, 64)), Dev((64,)), out=Dev((4, 32))), "out has shape (4, 32)"),
    (lambda: N.rmsnorm(Dev((4, 64), strides=(128, 2)), Dev((64,)), out=Dev((4, 64))), "contiguous in its last dim"),
    (lambda: N.rmsnorm(Dev((4, 20000)), Dev((20000,)), out=Dev((4, 20000))), "exceed the largest compiled row block"),
    (lambda: N.rmsnorm(np.zeros((4, 64), np.float32), Dev((64,)), out=Dev((4, 64))), "host (CPU) memory"),
    (lambda: N.add_rmsnorm(Dev((4, 64)), Dev((4, 65)), Dev((64,)), out=Dev((4, 64))), "residual has shape"),
    (lambda: N.gated_rmsnorm(Dev((4, 100)), Dev((4, 100)), Dev((128,)), out=Dev((4, 100))), "not a multiple of"),
    (lambda: RO.qk_norm_rope(Dev((3, 8 * 512)), Dev((3, 2 * 256)), Dev((3,), "<i4"), Dev((256,)), Dev((256,)), 8, 2,
                            192), "head_dim must be one of"),
    (lambda: RO.qk_norm_rope(Dev((3, 8 * 512)), Dev((3, 2 * 256)), Dev((3,), "<i8"), Dev((256,)), Dev((256,)), 8, 2,
                            256, q_out=Dev((3, 8, 256)), k_out=Dev((3, 2, 256))), "positions must be int32"),
    (lambda: RO.qk_norm_rope(Dev((3, 8 * 500)), Dev((3, 2 * 256)), Dev((3,), "<i4"), Dev((256,)), Dev((256,)), 8, 2,
                            256), "expected num_q_heads*2*head_dim"),
    (lambda: AC.silu_mul(Dev((2, 33)), out=Dev((2, 16))), "odd number of columns"),
    (lambda: AC.sigmoid_mul(Dev((2, 4 * 64)), Dev((2, 4, 64))), "head dim must be one of"),
    (lambda: EM.embedding(Dev((3,), "<f4"), Dev((10, 64)), out=Dev((3, 64))), "ids must be int32"),
])
def test_bad_input_is_refused_before_launch(rec, call, msg):
    with pytest.raises(OpError, match=None) as ei:
        call()
    assert msg in str(ei.value), str(ei.value)
    name = str(ei.value).split(": ")[1].split(" ")[0]
    assert f"{name}: {name}:" not in str(ei.value), str(ei.value)  # the argument is named once
    assert rec.calls == []


def test_every_required_base_exists_in_every_manifest():
    from vkc_runtime import registry
    root = Path(__file__).resolve().parents[1]
    req = registry.required()
    assert {b for b in req if b.startswith("norm.")} == {b for b in MANIFEST["kernels"] if b.startswith("norm.")}
    for m in sorted((root / "manifests").glob("sm_*.json")):
        kernels = json.loads(m.read_text())["kernels"]
        assert req <= set(kernels), (m.name, sorted(req - set(kernels)))


def test_argument_named_once_and_operror_public():
    import vkc_runtime
    import vkc_runtime.ops
    with pytest.raises(vkc_runtime.OpError) as ei:
        N.rmsnorm(np.zeros((4, 64), np.float32), Dev((64,)), out=Dev((4, 64)))
    assert str(ei.value).startswith("rmsnorm: x: tensor lives in host (CPU) memory"), str(ei.value)
    assert vkc_runtime.OpError is vkc_runtime.ops.OpError is OpError and issubclass(OpError, ValueError)
