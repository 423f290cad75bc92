"""Subprocess entry of the mutation runner: ``python -m tests.mutation._child COPY_ROOT PYTEST_ARGS...``.

Imports the package ``kernels_src`` from COPY_ROOT (a temporary directory holding the mutated copy) before
pytest starts, so every later ``import kernels_src.<family>.<module>`` -- the tests import kernels that way --
resolves inside the copy even though pytest puts the repository root first on sys.path. Only the (empty)
package ``__init__`` runs here: triton is imported later, after tests/conftest.py has set TRITON_INTERPRET.
"""
from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    copy_root = Path(argv[0]).resolve()
    sys.path.insert(0, str(copy_root))
    import kernels_src

    where = Path(kernels_src.__file__).resolve().parent
    if where != copy_root / "kernels_src":
        print(f"mutation child: kernels_src imported from {where}, not from {copy_root}", file=sys.stderr)
        return 9
    import pytest

    return int(pytest.main(argv[1:]))


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
