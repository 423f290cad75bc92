"""Runner of the kernel mutation suite (table: tests/mutation/table.py).

For every mutation: copy the repository's kernels_src/ into a fresh temporary directory, apply the one edit
(refusing a snippet that does not occur exactly once), run the mutation's test selection in a subprocess
that imports kernels_src from the copy (tests/mutation/_child.py), and require the tests to FAIL (pytest
exit status 1: tests ran and some failed; an import error, a crash, a timeout or an empty selection is a
defect of the entry, not a catch). Before that, the unmutated sources must pass the union of all
selections, and a sanity probe (a mutated copy whose import raises) must fail with the probe's message,
which proves the subprocess really runs the copy.

    python -m tests.mutation                 # everything, 2 workers
    python -m tests.mutation -j 1 --only gdn-beta-sign rope-rotation-sign
    python -m tests.mutation --write-readme  # record the run in tests/mutation/README.md
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as _dt
import hashlib
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.mutation.table import FAMILIES, MUTATIONS, SANITY, SANITY_MARKER, Mutation

ROOT = Path(__file__).resolve().parents[2]
KERNELS = "kernels_src"
README = Path(__file__).with_name("README.md")
BEGIN, END = "<!-- BEGIN GENERATED RESULTS -->", "<!-- END GENERATED RESULTS -->"
TIMEOUT_S = int(os.environ.get("VKC_MUTATION_TIMEOUT", "300"))  # per subprocess (baseline: twice)


class TableError(RuntimeError):
    """The table does not fit the current kernel sources (a snippet missing or ambiguous)."""


@dataclass
class Outcome:
    mutation: Mutation
    rc: int | None          # pytest exit status (None: timed out)
    seconds: float
    failed: list[str]       # node ids of failing tests, from pytest's summary
    tail: str               # last lines of the subprocess output
    output: str = ""        # all of it

    @property
    def caught(self) -> bool:
        return self.rc == 1 and bool(self.failed)

    @property
    def status(self) -> str:
        if self.caught:
            return "caught"
        return {None: "timeout", 0: "SURVIVED", 5: "no tests selected", 2: "interrupted / collection error",
                4: "usage error", 9: "copy not imported"}.get(self.rc, f"exit {self.rc}")


def family_of(m: Mutation) -> str:
    return m.file.split("/")[0] if "/" in m.file else "common"


def check_table(mutations=MUTATIONS, root: Path = ROOT) -> None:
    ids = [m.id for m in mutations]
    dup = {i for i in ids if ids.count(i) > 1}
    if dup:
        raise TableError(f"duplicate mutation ids: {sorted(dup)}")
    for m in mutations:
        apply(m, (root / KERNELS / m.file).read_text())
        if not (root / m.tests).is_file():
            raise TableError(f"{m.id}: test file {m.tests} not found")


def apply(m: Mutation, text: str) -> str:
    n = text.count(m.old)
    if n != 1:
        raise TableError(f"{m.id}: snippet found {n} times in {KERNELS}/{m.file} (must be exactly once): "
                         f"{m.old!r}")
    if m.old == m.new:
        raise TableError(f"{m.id}: replacement equals the original")
    return text.replace(m.old, m.new)


def make_copy(dest: Path, m: Mutation | None, root: Path = ROOT) -> Path:
    """dest/kernels_src: a copy of the repository's sources with ``m`` applied; returns dest."""
    shutil.copytree(root / KERNELS, dest / KERNELS, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if m is not None:
        p = dest / KERNELS / m.file
        p.write_text(apply(m, p.read_text()))
    return dest


def pytest_args(tests: list[str], k: str | None) -> list[str]:
    args = ["-q", "-x", "-p", "no:cacheprovider", "-m", "not gpu", *tests]
    if k:
        args += ["-k", k]
    return args


_FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.M)


def run_selection(m: Mutation | None, tests: list[str], k: str | None, timeout: float = TIMEOUT_S,
                  root: Path = ROOT) -> Outcome:
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="vkc-mutation-") as tmp:
        make_copy(Path(tmp), m, root)
        env = {k_: v for k_, v in os.environ.items() if k_ not in ("VKC_NORM_TEST_DEVICE", "PYTEST_ADDOPTS")}
        env["TRITON_INTERPRET"] = "1"
        env["PYTHONPATH"] = os.pathsep.join([tmp, env["PYTHONPATH"]]) if env.get("PYTHONPATH") else tmp
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        cmd = [sys.executable, "-m", "tests.mutation._child", tmp, *pytest_args(tests, k)]
        try:
            p = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
            rc, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            rc = None
            out = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
    tail = "\n".join(out.strip().splitlines()[-15:])
    return Outcome(m or SANITY, rc, time.monotonic() - t0, _FAILED.findall(out), tail if rc is not None else out,
                   out)


def run_suite(mutations=MUTATIONS, jobs: int = 2, log=print, root: Path = ROOT):
    """(baseline outcome, sanity outcome, mutation outcomes). Raises TableError before running anything if
    the table does not apply."""
    check_table(mutations, root)
    check_table([SANITY], root)
    files = sorted({m.tests for m in mutations})
    with cf.ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        # baseline: per test file, the union of its mutations' selections on the unmutated sources
        base_fs = []
        for f in files:
            ks = [m.k for m in mutations if m.tests == f]
            k_union = None if None in ks else " or ".join(f"({k})" for k in sorted(set(ks)))
            base_fs.append(pool.submit(run_selection, None, [f], k_union, 2 * TIMEOUT_S, root))
        sanity_f = pool.submit(run_selection, SANITY, [SANITY.tests], SANITY.k, TIMEOUT_S, root)
        futs = {pool.submit(run_selection, m, [m.tests], m.k, TIMEOUT_S, root): m for m in mutations}
        parts = [bf.result() for bf in base_fs]
        worst = max(parts, key=lambda o: (o.rc != 0, o.rc or 0))
        base = Outcome(None, None if any(o.rc is None for o in parts) else worst.rc,
                       sum(o.seconds for o in parts), [x for o in parts for x in o.failed],
                       "\n".join(o.tail for o in parts if o.rc != 0), "")
        log(f"baseline (unmutated, {len(files)} files): exit {base.rc}, {base.seconds:.0f}s of runs")
        sanity = sanity_f.result()
        log(f"sanity probe: exit {sanity.rc}, marker {'seen' if SANITY_MARKER in sanity.output else 'MISSING'}")
        outs = {}
        for f in cf.as_completed(futs):
            o = f.result()
            outs[o.mutation.id] = o
            log(f"  {o.status:>8}  {o.mutation.id:<34} {o.seconds:5.0f}s  {o.failed[0] if o.failed else ''}")
    return base, sanity, [outs[m.id] for m in mutations]


def verdict(base: Outcome, sanity: Outcome, outs: list[Outcome]) -> list[str]:
    """Problems (empty: the suite passed)."""
    bad = []
    if base.rc != 0:
        bad.append(f"baseline (unmutated sources) does not pass: exit {base.rc}\n{base.tail}")
    if sanity.rc in (0, None) or SANITY_MARKER not in sanity.output:
        bad.append(f"sanity probe not seen: the subprocess may not import the mutated copy\n{sanity.tail}")
    for o in outs:
        if not o.caught:
            bad.append(f"{o.mutation.id}: {o.status}\n{o.tail}")
    fams = {family_of(o.mutation) for o in outs}
    missing = [f for f in FAMILIES if f not in fams]
    if missing and len(outs) == len(MUTATIONS):
        bad.append(f"families without a mutation: {missing}")
    return bad


def sources_digest(root: Path = ROOT) -> str:
    h = hashlib.sha256()
    for p in sorted((root / KERNELS).rglob("*.py")):
        h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:16]


def git_head(root: Path = ROOT) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _cell(s: str) -> str:
    return "`" + s.replace("|", "\\|").replace("\n", " ⏎ ").strip() + "`"


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def markdown(base: Outcome, sanity: Outcome, outs: list[Outcome], jobs: int, wall: float, cpu: float) -> str:
    caught = sum(o.caught for o in outs)
    when = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Run of `python -m tests.mutation -j {jobs} --write-readme` at {when}, commit {git_head()}, "
        f"kernels_src digest {sources_digest()}: **{caught} of {len(outs)} mutations caught**; baseline "
        f"(unmutated) exit {base.rc}; sanity probe {'failed as it must' if sanity.rc not in (0, None) and SANITY_MARKER in sanity.output else 'NOT SEEN'}; "
        f"wall time {wall:.0f} s with {jobs} workers, {cpu:.0f} CPU seconds in the subprocesses "
        f"(load average {os.getloadavg()[0]:.1f} at the end: the machine may be shared).",
        "",
        "| id | file | mutation (original → replacement) | what it breaks | selection | outcome | first failing test | s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for o in outs:
        m = o.mutation
        sel = f"{m.tests}" + (f" -k '{m.k}'" if m.k else "")
        first = o.failed[0].replace("tests/", "", 1) if o.failed else "—"
        lines.append(f"| {m.id} | {m.file} | {_cell(m.old)} → {_cell(m.new)} | {m.what} | {_cell(sel)} | "
                     f"{o.status} | {_cell(first)} | {o.seconds:.0f} |")
    return "\n".join(lines) + "\n"


def write_readme(section: str, path: Path = README) -> None:
    text = path.read_text()
    a, b = text.index(BEGIN) + len(BEGIN), text.index(END)
    path.write_text(text[:a] + "\n" + section + text[b:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.mutation", description=__doc__.split("\n\n")[0])
    ap.add_argument("-j", "--jobs", type=int, default=int(os.environ.get("VKC_MUTATION_JOBS", "2")))
    ap.add_argument("--only", nargs="+", metavar="ID", help="run only these mutation ids")
    ap.add_argument("--list", action="store_true", help="print the table and exit")
    ap.add_argument("--write-readme", action="store_true", help=f"record the results in {README.relative_to(ROOT)}")
    a = ap.parse_args(argv)
    muts = MUTATIONS
    if a.only:
        unknown = set(a.only) - {m.id for m in MUTATIONS}
        if unknown:
            ap.error(f"unknown ids: {sorted(unknown)}")
        muts = tuple(m for m in MUTATIONS if m.id in a.only)
    if a.list:
        check_table(muts)
        for m in muts:
            print(f"{m.id:<34} {m.file:<22} {m.tests} -k {m.k!r}: {m.what}")
        return 0
    t0, c0 = time.monotonic(), children_cpu_s()
    base, sanity, outs = run_suite(muts, a.jobs)
    wall, cpu = time.monotonic() - t0, children_cpu_s() - c0
    bad = verdict(base, sanity, outs)
    print(f"{sum(o.caught for o in outs)}/{len(outs)} caught in {wall:.0f}s ({cpu:.0f} CPU s in subprocesses)")
    if a.write_readme:
        if a.only:
            ap.error("--write-readme records complete runs only (drop --only)")
        write_readme(markdown(base, sanity, outs, a.jobs, wall, cpu))
    for b in bad:
        print("PROBLEM:", b, file=sys.stderr)
    return 1 if bad else 0
