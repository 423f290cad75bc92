"""The kernel mutation suite as pytest tests.

test_table_applies (every run, < 1 s): the table is well formed and every snippet occurs exactly once in
today's kernels_src/, so a kernel edit that invalidates an entry fails the ordinary test run at once.

test_mutation_suite (marked ``mutation``; deselected unless ``-m`` names it, see tests/conftest.py): the
whole suite -- unmutated baseline passes, the sanity probe proves the subprocesses import the mutated copy,
every mutation is caught. ``.ci/run`` runs it: ``.venv/bin/python -m pytest -q -m mutation tests/mutation``.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.mutation import runner
from tests.mutation.table import FAMILIES, MUTATIONS, SANITY, Mutation


def test_table_applies():
    runner.check_table()
    runner.check_table([SANITY])
    assert len(MUTATIONS) >= 25
    fams = {runner.family_of(m) for m in MUTATIONS}
    assert set(FAMILIES) <= fams, f"families without a mutation: {set(FAMILIES) - fams}"
    for m in MUTATIONS:
        assert m.tests.startswith("tests/test_") and m.tests.endswith("_interp.py"), m.id
        assert m.what and m.id == m.id.strip().lower(), m.id


def test_stale_snippet_is_refused(tmp_path):
    """A snippet that is missing, or present twice, stops the runner before anything runs."""
    src = Path(runner.ROOT, runner.KERNELS, "norm/norm.py").read_text()
    gone = Mutation("x", "norm/norm.py", "no such line in the kernel", "y", "t", None, "")
    with pytest.raises(runner.TableError, match="found 0 times"):
        runner.apply(gone, src)
    twice = Mutation("x", "norm/norm.py", "tl.program_id(0)", "y", "t", None, "")
    assert src.count("tl.program_id(0)") > 1
    with pytest.raises(runner.TableError, match="found [2-9]"):
        runner.apply(twice, src)
    m = MUTATIONS[0]
    original = Path(runner.ROOT, runner.KERNELS, m.file)
    before = original.read_text()
    text = (runner.make_copy(tmp_path, m) / "kernels_src" / m.file).read_text()
    assert text == before.replace(m.old, m.new) and text != before
    assert original.read_text() == before, "the repository's kernel must stay unmutated"


@pytest.mark.mutation
def test_mutation_suite():
    jobs = int(os.environ.get("VKC_MUTATION_JOBS", "2"))
    base, sanity, outs = runner.run_suite(MUTATIONS, jobs, log=lambda s: None)
    bad = runner.verdict(base, sanity, outs)
    assert not bad, "\n\n".join(bad)
