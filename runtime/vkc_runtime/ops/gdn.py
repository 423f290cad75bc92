"""Typed op of the GDN family: chunked gated-delta-rule prefill, kernels_src/gdn/chunk.py.

:func:`chunk_gated_delta_rule` takes the Qwen3.6 layer's tensors after the causal conv + SiLU:
``qkv [T, 2*Hk*128 + Hv*128]`` bf16 (channels [q | k | v], heads contiguous inside each), ``a``, ``b``
``[T, Hv]`` bf16, ``A_log``, ``dt_bias`` ``[Hv]`` fp32, ``cu_seqlens`` int32 ``[N+1]`` (packed varlen batch) and
returns ``o [T, Hv, 128]`` bf16. With ``state [slots, Hv, 128, 128]`` fp32 + ``slot_idx`` int32 ``[N]`` the initial
state of sequence n is ``state[slot_idx[n]]`` (a slot outside [0, slots), e.g. -1: zero initial state, nothing
written back; checked on the device) and its final state is written back in place to the same slot. Two
sequences must not share a valid slot (if they do, the slot's result is unspecified, but nothing outside the
state pool is touched).

Launches (one stream, no host sync, no allocation when ``workspace=`` and ``out=`` are given):
chunk_index (1,) -> prep (C, Hk) -> kkt_wy (C*Hv,) -> delta_h (N, Hv, 128/BV) -> chunk_o (C*Hv*128/BV,), with
C = T // 64 + N, an upper bound of the number of 64-token chunks (the chunk table is built on the device from
cu_seqlens; unused entries make their programs exit). Graph-capturable on any stream, torch's capture stream
included: every buffer, delta_h's hidden global scratch on sm_90a too, comes from the workspace (one workspace
must not be used by two streams at the same time).

``cu_seqlens`` values are not read on the host (that would sync); they must be non-decreasing with
``cu_seqlens[0] == 0`` and ``cu_seqlens[N] == T``. The device clamps them to [0, T] (a decreasing offset gives
an empty sequence), so bad values give wrong results but never out-of-bounds accesses.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import memory
from ..kernels import get_kernel
from ..scratch import GlobalScratch
from ._check import OpError, fits_i32, same_device, stream_of, tensor

__all__ = ["chunk_gated_delta_rule", "GdnWorkspace", "workspace_for", "BASES", "BT", "HEAD_K", "HEAD_V"]

BT = 64
HEAD_K = 128
HEAD_V = 128
_KERNELS = ("chunk_index", "prep", "kkt_wy", "delta_h", "chunk_o")  # in launch order


def _base(kernel: str) -> str:
    """The kernel name (spelled once: the op calls this, BASES is built from it)."""
    return f"gdn.{kernel}"


BASES = tuple(_base(k) for k in _KERNELS)

BF16, F32, I32 = "bfloat16", "float32", "int32"


def max_chunks(max_tokens: int, max_seqs: int) -> int:
    """Upper bound of the number of 64-token chunks of any batch of <= max_tokens tokens in <= max_seqs sequences."""
    return max_tokens // BT + max_seqs


@dataclass
class GdnWorkspace:
    """Every scratch buffer of the prefill, allocated up front (pass it to each call; reuse across layers).

    Sizes (bf16 = 2 B, fp32/i32 = 4 B), Tm = max_tokens, C = Tm // 64 + max_seqs:
      seqinfo i32 [max_seqs, 4], cidx i32 [C, 2]           chunk tables (built on the device)
      qn, kn  bf16 [Tm, Hk, 128]                           L2-normalised q, k
      g, beta fp32 [Tm, Hv]                                chunk-local cumsum of the log gate, sigmoid(b)
      w, u    bf16 [Tm, Hv, 128]                           WY factors; u becomes V' = U - W S in place
      h       bf16 [C, Hv, 128 (V), 128 (K)]               state entering each chunk (transposed)
      scratch                                              Triton's global scratch of delta_h (None where the
                                                           arch's delta_h needs none: all but sm_90a)
    No buffer needs zero-filling: each element a kernel reads was written earlier in the same call.
    One workspace must not be used by launches on two streams at the same time.
    """
    max_tokens: int
    max_seqs: int
    num_k_heads: int
    num_v_heads: int
    device: int
    seqinfo: memory.DeviceArray
    cidx: memory.DeviceArray
    qn: memory.DeviceArray
    kn: memory.DeviceArray
    g: memory.DeviceArray
    beta: memory.DeviceArray
    w: memory.DeviceArray
    u: memory.DeviceArray
    h: memory.DeviceArray
    dummy_state: memory.DeviceArray
    dummy_slot: memory.DeviceArray
    scratch: GlobalScratch | None = None

    @property
    def max_chunks(self) -> int:
        return max_chunks(self.max_tokens, self.max_seqs)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.seqinfo, self.cidx, self.qn, self.kn, self.g, self.beta, self.w, self.u,
                                      self.h, self.dummy_state, self.dummy_slot)) + (
            self.scratch.nbytes if self.scratch is not None else 0)

    @staticmethod
    def bytes_needed(max_tokens: int, max_seqs: int, num_k_heads: int, num_v_heads: int) -> int:
        C = max_chunks(max_tokens, max_seqs)
        Tm, hk, hv = max_tokens, num_k_heads, num_v_heads
        return (16 * max_seqs + 8 * C + 2 * 2 * Tm * hk * HEAD_K + 2 * 4 * Tm * hv
                + 2 * 2 * Tm * hv * HEAD_K + 2 * C * hv * HEAD_K * HEAD_V + 64 + 16)


def workspace_for(max_tokens: int, max_seqs: int, num_k_heads: int, num_v_heads: int,
                  device: int | None = None) -> GdnWorkspace:
    """Allocate a :class:`GdnWorkspace` for batches of up to ``max_tokens`` tokens in up to ``max_seqs``
    sequences, delta_h's global scratch included, and load the five kernels (allocates: call it before any
    graph capture; a capture on any stream may follow without an eager warm-up)."""
    op = "gdn.workspace_for"
    Tm, S, hk, hv = int(max_tokens), int(max_seqs), int(num_k_heads), int(num_v_heads)
    if Tm < 1 or S < 1:
        raise OpError(f"{op}: max_tokens and max_seqs must be >= 1, got {Tm}, {S}")
    _check_heads(op, hk, hv)
    C = max_chunks(Tm, S)
    fits_i32(op, max_tokens=Tm, max_chunks=C)

    def e(shape, dt):
        return memory.DeviceArray.empty(shape, dt, device=device)

    seqinfo = e((S, 4), I32)  # makes the device's context current: the kernel lookups below need it
    for k in _KERNELS:  # load them now, so that a capture right after needs no eager warm-up
        get_kernel(_base(k), device=device).load()
    k_dh = get_kernel(_base("delta_h"), device=device)
    n_scratch = k_dh.scratch_bytes((S, hv, HEAD_V // int(k_dh.constexprs["BV"])))  # delta_h's largest grid
    return GdnWorkspace(
        max_tokens=Tm, max_seqs=S, num_k_heads=hk, num_v_heads=hv, device=-1 if device is None else int(device),
        seqinfo=seqinfo, cidx=e((C, 2), I32),
        qn=e((Tm, hk, HEAD_K), BF16), kn=e((Tm, hk, HEAD_K), BF16),
        g=e((Tm, hv), F32), beta=e((Tm, hv), F32),
        w=e((Tm, hv, HEAD_K), BF16), u=e((Tm, hv, HEAD_V), BF16),
        h=e((C, hv, HEAD_V, HEAD_K), BF16),
        dummy_state=e((16,), F32), dummy_slot=e((4,), I32),
        scratch=GlobalScratch(n_scratch, device=device) if n_scratch else None)


def _scratch_of(ws: GdnWorkspace) -> dict:
    """delta_h's global scratch from the workspace (a kernel that needs none ignores it)."""
    return {} if ws.scratch is None else {"scratch": ws.scratch}


def _check_heads(op: str, hk: int, hv: int) -> None:
    if hk < 1 or hv < 1 or hv % hk:
        raise OpError(f"{op}: num_v_heads ({hv}) must be a positive multiple of num_k_heads ({hk})")
    if hv > 65535:
        raise OpError(f"{op}: num_v_heads {hv} exceeds the grid y limit 65535")


def _contig(op: str, name: str, t) -> None:
    if not t.is_contiguous():
        raise OpError(f"{op}: {name} must be contiguous (row-major), got strides {tuple(t.strides)} for shape "
                      f"{tuple(t.shape)}")


def _aligned16(op: str, name: str, t) -> None:
    if t.ptr % 16:
        raise OpError(f"{op}: {name} data pointer {t.ptr:#x} is not 16-byte aligned (the kernels are compiled "
                      f"for 16-byte aligned buffers)")


def chunk_gated_delta_rule(qkv, a, b, A_log, dt_bias, cu_seqlens, num_k_heads: int, num_v_heads: int, *,
                           state=None, slot_idx=None, out=None, workspace: GdnWorkspace | None = None,
                           stream=None):
    """Chunked gated-delta-rule forward over a packed varlen batch; returns ``out`` ([T, Hv, 128] bf16).

    q, k are L2-normalised in the kernel (eps 1e-6 inside the sqrt), scale = 128^-0.5,
    g = -exp(A_log) softplus(a + dt_bias), beta = sigmoid(b), both fp32 (never rounded through bf16).
    Pass ``out=`` and ``workspace=`` (from :func:`workspace_for`) inside graph capture.
    """
    op = "chunk_gated_delta_rule"
    hk, hv = int(num_k_heads), int(num_v_heads)
    _check_heads(op, hk, hv)
    C_qkv = 2 * hk * HEAD_K + hv * HEAD_V
    qt = tensor(op, "qkv", qkv, BF16, ndim=2, shape=(None, C_qkv))
    T = qt.shape[0]
    sq = int(qt.strides[0]) if T > 1 else C_qkv
    if sq % 16 or sq < C_qkv:
        raise OpError(f"{op}: qkv row stride {sq} must be >= {C_qkv} and a multiple of 16")
    _aligned16(op, "qkv", qt)
    at = tensor(op, "a", a, BF16, ndim=2, shape=(T, hv))
    bt = tensor(op, "b", b, BF16, ndim=2, shape=(T, hv))
    sa = int(at.strides[0]) if T > 1 else hv
    sb = int(bt.strides[0]) if T > 1 else hv
    alt = tensor(op, "A_log", A_log, F32, ndim=1, shape=(hv,))
    dtt = tensor(op, "dt_bias", dt_bias, F32, ndim=1, shape=(hv,))
    cut = tensor(op, "cu_seqlens", cu_seqlens, I32, ndim=1)
    _contig(op, "cu_seqlens", cut)
    N = cut.shape[0] - 1
    if N < 1:
        raise OpError(f"{op}: cu_seqlens must hold N+1 >= 2 offsets, got shape {tuple(cut.shape)}")
    ts = [qt, at, bt, alt, dtt, cut]
    if (state is None) != (slot_idx is None):
        raise OpError(f"{op}: pass state and slot_idx together (or neither)")
    st = sl = None
    if state is not None:
        st = tensor(op, "state", state, F32, ndim=4, shape=(None, hv, HEAD_K, HEAD_V))
        _contig(op, "state", st)
        _aligned16(op, "state", st)
        sl = tensor(op, "slot_idx", slot_idx, I32, ndim=1, shape=(N,))
        _contig(op, "slot_idx", sl)
        ts += [st, sl]
    res = out if out is not None else memory.DeviceArray.empty((T, hv, HEAD_V), BF16,
                                                              device=qt.device if qt.device >= 0 else None)
    ot = tensor(op, "out", res, BF16, ndim=3, shape=(T, hv, HEAD_V))
    _contig(op, "out", ot)
    _aligned16(op, "out", ot)
    ts.append(ot)
    dev = same_device(op, *ts)
    if T == 0:
        return res
    num_slots = st.shape[0] if st is not None else 0  # 0: no state (delta_h then never reads the slot pointer)
    fits_i32(op, T=T, stride_qkv=sq, stride_a=sa, stride_b=sb, N=N, num_slots=num_slots)
    ws = workspace
    if ws is None:
        ws = workspace_for(T, N, hk, hv, device=dev if dev >= 0 else None)
    if not isinstance(ws, GdnWorkspace):
        raise OpError(f"{op}: workspace must be a GdnWorkspace (from gdn.workspace_for), got {type(ws).__name__}")
    if (ws.num_k_heads, ws.num_v_heads) != (hk, hv):
        raise OpError(f"{op}: workspace was sized for {ws.num_k_heads}/{ws.num_v_heads} heads, call has {hk}/{hv}")
    if T > ws.max_tokens or N > ws.max_seqs:
        raise OpError(f"{op}: workspace holds {ws.max_tokens} tokens / {ws.max_seqs} sequences, call needs {T} / {N}")
    if dev >= 0 and ws.seqinfo.device >= 0 and ws.seqinfo.device != dev:
        raise OpError(f"{op}: workspace is on device {ws.seqinfo.device}, tensors on device {dev}")
    C = max_chunks(T, N)
    s = stream_of(stream)

    k_idx, k_prep, k_wy, k_dh, k_o = (get_kernel(_base(k)) for k in _KERNELS)
    bv_h = int(k_dh.constexprs["BV"])
    bv_o = int(k_o.constexprs["BV"])
    if N > 2**31 - 1 or C > 2**31 - 1:
        raise OpError(f"{op}: too many sequences/chunks for the grid")
    fits_i32(op, grid=C * hv * (HEAD_V // bv_o))  # before any launch

    k_idx.launch((1, 1, 1), (cut.ptr, ws.seqinfo.ptr, ws.cidx.ptr, N, T, C), s)
    k_prep.launch((C, hk, 1), (qt.ptr, at.ptr, bt.ptr, alt.ptr, dtt.ptr, ws.cidx.ptr, ws.qn.ptr, ws.kn.ptr,
                               ws.g.ptr, ws.beta.ptr, sq, sa, sb, hk, hv), s)
    v_ptr = qt.ptr + 2 * hk * HEAD_K * 2  # v channels of qkv (bf16): 16-byte aligned as 2*hk*128*2 % 16 == 0
    k_wy.launch((C * hv, 1, 1), (ws.kn.ptr, v_ptr, ws.g.ptr, ws.beta.ptr, ws.cidx.ptr, ws.w.ptr, ws.u.ptr, sq, hk, hv),
                s)
    k_dh.launch((N, hv, HEAD_V // bv_h),
                (ws.kn.ptr, ws.w.ptr, ws.u.ptr, ws.g.ptr, ws.h.ptr,
                 st.ptr if st is not None else ws.dummy_state.ptr, sl.ptr if sl is not None else ws.dummy_slot.ptr,
                 ws.seqinfo.ptr, hk, hv, num_slots), s, **_scratch_of(ws))
    k_o.launch((C * hv * (HEAD_V // bv_o), 1, 1),
               (ws.qn.ptr, ws.kn.ptr, ws.u.ptr, ws.g.ptr, ws.h.ptr, ws.cidx.ptr, ot.ptr, hk, hv,
                float(HEAD_K ** -0.5)), s)
    return res
