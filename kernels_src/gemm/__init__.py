"""GEMM family written with the CUTLASS CuTe DSL (built by the CuTe lane of `vkc regen`: aot/vkc/cute_lane.py).

Importing this package imports nothing from the DSL: the kernel modules (``sm90_wgmma``) are imported only inside
the DSL's own virtual environment, by the build subprocess; ``spec.py`` is plain Python.
"""
