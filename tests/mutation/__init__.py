"""Kernel mutation suite: known-wrong edits of kernels_src/ (one at a time, on temporary copies) that the CPU
interpreter tests must fail. The table is tests/mutation/table.py, the runner tests/mutation/runner.py
(``python -m tests.mutation``), the last recorded run tests/mutation/README.md."""
