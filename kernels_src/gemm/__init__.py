"""BF16 GEMM family written with the CUTLASS CuTe DSL (built by tools/cute/build.py, not by the Triton regen).

Importing this package imports nothing from the DSL: the kernel modules (``sm90_wgmma``) are imported only inside
the DSL's own virtual environment, by the build subprocess; :mod:`kernels_src.gemm.variants` (the build
description) is plain Python.
"""
