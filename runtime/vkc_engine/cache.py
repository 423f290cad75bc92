"""Cache accounting and storage: paged KV blocks for the full-attention layers, one slot per running sequence
for the GDN layers' recurrent (fp32) and conv states.

A sequence holds ``ceil(context / block_size)`` blocks (the same block ids in every attention layer) and one
state slot (the same slot index in every GDN layer). :class:`BlockPool` and :class:`SlotPool` only count;
:class:`CacheStorage` owns the device arrays. :func:`plan_cache` turns a byte budget into block and slot
counts.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CacheError", "BlockPool", "SlotPool", "CachePlan", "plan_cache", "CacheStorage", "bytes_per_block",
           "bytes_per_slot"]


class CacheError(RuntimeError):
    """The cache budget cannot hold what was asked (too small, or a sequence longer than the whole cache)."""


class BlockPool:
    """Free-list accounting of ``num_blocks`` KV blocks of ``block_size`` tokens."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise CacheError(f"need at least one block of at least one token, got {num_blocks} x {block_size}")
        self.num_blocks, self.block_size = int(num_blocks), int(block_size)
        self._free = list(range(self.num_blocks - 1, -1, -1))  # pop() hands out low ids first

    @property
    def num_free(self) -> int:
        return len(self._free)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def can_grow(self, table: list[int], tokens: int) -> bool:
        return self.blocks_for(tokens) - len(table) <= len(self._free)

    def grow(self, table: list[int], tokens: int) -> None:
        """Append blocks to ``table`` until it covers ``tokens`` tokens (check :meth:`can_grow` first)."""
        need = self.blocks_for(tokens) - len(table)
        if need > len(self._free):
            raise CacheError(f"need {need} more KV blocks, {len(self._free)} free")
        for _ in range(need):
            table.append(self._free.pop())

    def release(self, table: list[int]) -> None:
        self._free.extend(reversed(table))
        table.clear()
        if len(self._free) > self.num_blocks:
            raise CacheError("a block was freed twice")


class SlotPool:
    """Free-list accounting of ``num_slots`` GDN state slots."""

    def __init__(self, num_slots: int):
        if num_slots < 1:
            raise CacheError(f"need at least one state slot, got {num_slots}")
        self.num_slots = int(num_slots)
        self._free = list(range(self.num_slots - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self) -> int:
        if not self._free:
            raise CacheError("no free state slot")
        return self._free.pop()

    def release(self, slot: int) -> None:
        if slot in self._free or not 0 <= slot < self.num_slots:
            raise CacheError(f"slot {slot} freed twice or out of range")
        self._free.append(slot)


def bytes_per_block(cfg, block_size: int) -> int:
    """KV bytes of one block over all attention layers (bf16 K and V)."""
    n_attn = len(cfg.layer_indices("full_attention"))
    return n_attn * 2 * block_size * cfg.num_kv_heads * cfg.head_dim * 2


def bytes_per_slot(cfg) -> int:
    """GDN state bytes of one slot over all linear-attention layers (fp32 recurrent + bf16 conv state)."""
    n_gdn = len(cfg.layer_indices("linear_attention"))
    rec = cfg.gdn_v_heads * cfg.gdn_head_dim * cfg.gdn_head_dim * 4
    conv = (cfg.conv_width - 1) * cfg.gdn_qkv_dim * 2
    return n_gdn * (rec + conv)


@dataclass(frozen=True)
class CachePlan:
    num_blocks: int
    block_size: int
    num_slots: int
    kv_bytes: int
    state_bytes: int

    def describe(self) -> str:
        return (f"KV cache: {self.num_blocks} blocks x {self.block_size} tokens ({self.kv_bytes / 2**20:.1f} MiB), "
                f"GDN states: {self.num_slots} slots ({self.state_bytes / 2**20:.1f} MiB)")


def plan_cache(cfg, budget_bytes: int, *, block_size: int, max_num_seqs: int, max_model_len: int,
               num_blocks: int | None = None) -> CachePlan:
    """Slots for ``max_num_seqs`` sequences, the rest of ``budget_bytes`` as KV blocks (or exactly
    ``num_blocks``). Raises :class:`CacheError` when one sequence of ``max_model_len`` tokens cannot fit."""
    per_slot, per_block = bytes_per_slot(cfg), bytes_per_block(cfg, block_size)
    state = per_slot * max_num_seqs
    if num_blocks is None:
        left = budget_bytes - state
        num_blocks = left // per_block if per_block else max_num_seqs * -(-max_model_len // block_size)
        if left <= 0:
            raise CacheError(f"the cache budget of {budget_bytes / 2**20:.1f} MiB does not hold the GDN states of "
                             f"{max_num_seqs} sequences ({state / 2**20:.1f} MiB): lower max_num_seqs")
    need = -(-max_model_len // block_size)
    if num_blocks < need:
        raise CacheError(f"the KV cache holds {num_blocks} blocks of {block_size} tokens, one sequence of "
                         f"max_model_len {max_model_len} needs {need}: raise the memory budget or lower max_model_len")
    return CachePlan(int(num_blocks), block_size, max_num_seqs, int(num_blocks) * per_block, state)


class CacheStorage:
    """The device arrays of a plan: per attention layer (k_cache, v_cache), per GDN layer (state, conv_state)."""

    def __init__(self, backend, cfg, plan: CachePlan):
        self.plan = plan
        self.kv: dict[int, tuple] = {}
        self.gdn: dict[int, tuple] = {}
        for i in cfg.layer_indices("full_attention"):
            shape = (plan.num_blocks, plan.block_size, cfg.num_kv_heads, cfg.head_dim)
            self.kv[i] = (backend.empty(shape, "bf16"), backend.empty(shape, "bf16"))
        for i in cfg.layer_indices("linear_attention"):
            st = backend.zeros((plan.num_slots, cfg.gdn_v_heads, cfg.gdn_head_dim, cfg.gdn_head_dim), "f32")
            cv = backend.zeros((plan.num_slots, cfg.conv_width - 1, cfg.gdn_qkv_dim), "bf16")
            self.gdn[i] = (st, cv)
        self._backend = backend

    def reset_slots(self, slots) -> None:
        """Zero the GDN states of freshly assigned slots (a new or recomputed sequence starts from zero)."""
        if not slots:
            return
        for st, cv in self.gdn.values():
            self._backend.zero_slots(st, slots)
            self._backend.zero_slots(cv, slots)
