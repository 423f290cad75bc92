"""The ``vkc`` command: one front door over the build tools (``vkc``: regen, verify, inspect, tune) and the
runtime tools (``vkc_runtime``: doctor). Each subcommand imports its side lazily, so neither side imports the other."""
from .main import main

__all__ = ["main"]
