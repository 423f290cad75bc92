"""``python -m tests.mutation``: run the kernel mutation suite (see tests/mutation/runner.py)."""
from tests.mutation.runner import main

raise SystemExit(main())
