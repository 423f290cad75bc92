"""Typed ops of the moe family (kernels_src/moe): the MoE block of Qwen3.6-35B-A3B.

Modules: ``grouped_ops`` (the grouped GEMMs over experts: :func:`grouped_gemm`, the block_m rule
:func:`choose_block_m`, :func:`load_kernels`).
"""
from .._check import OpError
from .grouped_ops import (BLOCK_MS, GROUPED_BASES, choose_block_m, grouped_gemm, load_kernels, max_blocks,
                          plan as grouped_plan)

BASES = GROUPED_BASES

__all__ = ["grouped_gemm", "choose_block_m", "max_blocks", "grouped_plan", "load_kernels", "BLOCK_MS",
           "GROUPED_BASES", "BASES", "OpError"]
