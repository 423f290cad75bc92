"""vkc_runtime: load vkc's vendored cubins through the CUDA driver API and launch them (numpy + cuda-bindings)."""
__version__ = "0.1.0"
