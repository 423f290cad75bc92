"""Stub: the grouped-GEMM specs of the moe family are helper moegemm's (its version replaces this file)."""
SPECS = []
