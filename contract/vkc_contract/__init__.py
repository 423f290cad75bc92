"""vkc_contract: what the build side (``vkc``, aot/) and the run side (``vkc_runtime``) must agree on.

Pure Python, standard library only, no side effects at import (no driver, no file access):

* :mod:`vkc_contract.arch`    the architecture table, binary-compatibility fallbacks
* :mod:`vkc_contract.abi`     the Triton kernel ABI: type widths, pack codes, hidden parameters
* :mod:`vkc_contract.hashing` SHA-256 over bytes and files, :class:`~vkc_contract.hashing.IntegrityError`
* :mod:`vkc_contract.layout`  manifest constants: schema version, where manifests and artifacts live, artifact kinds

``vkc`` (the generator) and ``vkc_runtime`` both import it; it imports neither.
"""
