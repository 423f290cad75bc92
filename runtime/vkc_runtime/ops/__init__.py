"""Typed ops over vkc's kernels (one module per family, e.g. ``norm.py``).

Each ops module declares the kernel bases it launches at import time with
``vkc_runtime.registry.require(...)`` and is imported from here, so that ``import vkc_runtime`` can
check (``registry.check_import``) that every required kernel has an artifact for this machine's GPU.
Ops use the public runtime API: ``memory.as_tensor`` (+ ``TensorRef.check``), ``stream.resolve_stream``
and ``launch.get_kernel(base).launch(grid, args, stream)``.
"""

from . import norm  # noqa: E402,F401  (each ops module registers the bases it launches)
from . import attention, conv, gdn, gdn_decode  # noqa: E402,F401
