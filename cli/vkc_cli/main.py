"""The `vkc` command line: regen, verify, inspect, tune (the build side, package ``vkc``), doctor (the runtime,
``vkc_runtime``), generate (the engine, ``vkc_engine``) and serve (the server, ``vkc_server``). Each subcommand
imports its side when it runs.

Every user error is one line and a non-zero exit status: click's usage errors (status 2) for bad arguments,
``Error: ...`` (status 1) for the rest; an unexpected exception is shown as one line too (``VKC_DEBUG=1``
re-raises it with its traceback)."""
from __future__ import annotations

import json
import os
import re
import sys
import time
from collections import Counter
from pathlib import Path

import click

from vkc_contract.arch import ALL_ARCHS, ARCHS, RUNTIME_VERIFIED

ARCH_CHOICE = click.Choice(list(ALL_ARCHS))


def _one_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {' '.join(str(e).split()) or '(no message)'}"


class _Group(click.Group):
    """Turns an exception escaping a subcommand into click's one-line ``Error: ...`` (exit status 1)."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except Exception as e:
            if os.environ.get("VKC_DEBUG"):
                raise
            raise click.ClickException(_one_line(e) + " (VKC_DEBUG=1 shows the traceback)") from None


def _archs(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> list[str]:
    """--arch, repeatable or comma-separated, checked against the arch table."""
    out: list[str] = []
    for item in value:
        for a in (x.strip() for x in item.split(",")):
            if a and a not in ARCHS:
                raise click.BadParameter(f"unknown arch {a!r} (known: {', '.join(ALL_ARCHS)})")
            if a and a not in out:
                out.append(a)
    return out


def _arch_option(help_: str):
    return click.option("--arch", "arch", multiple=True, callback=_archs, metavar="ARCH[,ARCH...]", help=help_)


def _root(root: str | None) -> Path:
    """The checkout to work on: --root (or a folder inside it), else VKC_ROOT, else found from the cwd."""
    from vkc import discover  # noqa: PLC0415

    try:
        r = discover.find_root(root)
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from None
    where = f"--root {root}" if root else (f"VKC_ROOT={os.environ['VKC_ROOT']}" if os.environ.get("VKC_ROOT")
                                            else str(r))
    if not ((r / discover.KERNELS_DIR).is_dir() and (r / "manifests").is_dir()):
        raise click.ClickException(f"{where}: not a vkc checkout (no {discover.KERNELS_DIR}/ and manifests/)")
    if root and r != Path(root).resolve() and r not in Path(root).resolve().parents:
        raise click.ClickException(f"{where}: not inside a vkc checkout (no {discover.KERNELS_DIR}/ and manifests/)")
    return r


def _artifact_root(root: str | None) -> tuple[Path, str]:
    """A checkout or an installed artifact root (wheel installs) for verify / inspect: ``(root, mode)``; one
    ``Error:`` line (exit 1) naming where the path came from when it is neither."""
    from vkc import discover  # noqa: PLC0415

    try:
        return discover.find_artifact_root(root)
    except FileNotFoundError as e:
        where = f"--root {root}: " if root else (f"VKC_ROOT={os.environ['VKC_ROOT']}: " if os.environ.get("VKC_ROOT")
                                                 else "")
        raise click.ClickException(f"{where}{e}") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="vkc")
def main() -> None:
    """vkc: ahead-of-time Triton kernels for 7 NVIDIA archs, vendored with SHA-256 manifests."""


@main.command()
@_arch_option("arch(s) to build, e.g. sm_90a (repeat or comma-separate)")
@click.option("--all", "all_", is_flag=True, help="build every arch: " + ", ".join(ALL_ARCHS))
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None, help="worker processes (default: CPU count)")
@click.option("--root", type=click.Path(file_okay=False), default=None, help="repository root (default: found from cwd)")
def regen(arch: list[str], all_: bool, jobs: int | None, root: str | None) -> None:
    """Compile every kernel spec for ARCH into vendored/<arch>/ and write manifests/<arch>.json.

    On a terminal a progress bar shows each kernel; otherwise (a log, CI) one line per arch and kernel family
    as it finishes."""
    archs = list(ALL_ARCHS) if all_ else arch
    if not archs:
        raise click.UsageError("name --arch ARCH or --all")
    r = _root(root)
    from vkc import regen as R  # noqa: PLC0415

    t0 = time.monotonic()
    try:
        docs = _with_progress(lambda cb: R.regen(r, archs, jobs=jobs, progress=cb), r, archs)
    except R.RegenError as e:
        click.echo(f"vkc regen: {e}", err=True)
        sys.exit(1)
    for a, doc in docs.items():
        files = {a_["path"]: a_["size"] for k in doc["kernels"].values()
                 for a_ in (k["artifacts"] if "artifacts" in k else [k["artifact"]])}
        size = sum(files.values())
        click.echo(f"{a}: {len(doc['kernels'])} kernels, {size / 1024:.1f} KiB -> vendored/{a}/, manifests/{a}.json")
    click.echo(f"regen done in {time.monotonic() - t0:.1f} s")


class FamilyLines:
    """A regen progress callback printing one line when a family of an arch, then the whole arch, is compiled."""

    def __init__(self, root: Path, archs: list[str], echo=click.echo) -> None:
        from vkc import discover  # noqa: PLC0415

        self.family = {}
        for a in archs:
            for b in discover.bases_for_arch(root, a):
                self.family[(a, b.spec.base)] = b.spec.family
        self.left_family = Counter((a, f) for (a, _), f in self.family.items())
        self.left_arch = Counter(a for a, _ in self.family)
        self.n_family, self.n_arch = dict(self.left_family), dict(self.left_arch)
        self.t0 = time.monotonic()
        self.echo = echo

    def __call__(self, what: str, done: int, total: int) -> None:
        arch, base = what.split(" ", 1)
        fam = self.family.get((arch, base))
        dt = time.monotonic() - self.t0
        if base.startswith("CuTe"):  # the CuTe lane reports once per arch (vkc.regen)
            self.echo(f"{arch} {base} ({dt:.0f} s)")
            return
        if fam is not None:
            self.left_family[(arch, fam)] -= 1
            if self.left_family[(arch, fam)] == 0:
                self.echo(f"[{done}/{total}] {arch} {fam}: {self.n_family[(arch, fam)]} kernels compiled ({dt:.0f} s)")
        self.left_arch[arch] -= 1
        if self.left_arch[arch] == 0:
            self.echo(f"[{done}/{total}] {arch}: all {self.n_arch[arch]} kernels compiled ({dt:.0f} s)")


def _with_progress(run, root: Path, archs: list[str]):
    if sys.stdout.isatty():
        try:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa
        except ImportError:
            pass
        else:
            with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                          TimeElapsedColumn()) as prog:
                task = prog.add_task("compiling", total=None)

                def cb(what: str, done: int, total: int) -> None:
                    prog.update(task, total=total, completed=done, description=f"compiling {what[:60]:<60}")
                return run(cb)
    return run(FamilyLines(root, archs))


_FIX = re.compile(r"; run `vkc regen --arch (\S+)`$")


def _stale_summary(problems: list[str]) -> tuple[list[str], str | None]:
    """Several stale archs: the problem lines without their per-arch repair command, and one repair line."""
    stale = [a for a in ALL_ARCHS if any((m := _FIX.search(p)) and m.group(1) == a for p in problems)]
    if len(stale) < 2:
        return problems, None
    lines = [_FIX.sub("", p) for p in problems]
    if len(stale) == len(ALL_ARCHS):
        return lines, "repair: run `vkc regen --all` (every arch is stale)"
    return lines, f"repair: run `vkc regen --arch {','.join(stale)}` ({len(stale)} archs are stale; or `vkc regen --all`)"


@main.command()
@_arch_option("check only these archs (repeat or comma-separate)")
@click.option("--rebuild", is_flag=True, help="also recompile in a temp copy and compare bytes (needs Triton)")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=None)
@click.option("--root", type=click.Path(file_okay=False), default=None)
def verify(arch: list[str], rebuild: bool, jobs: int | None, root: str | None) -> None:
    """Fatal drift check of manifests/ and vendored/ against kernels_src/, the specs and the pins."""
    from vkc import verify as V  # noqa: PLC0415

    r, mode = _artifact_root(root)
    if rebuild and mode != V.CHECKOUT:
        raise click.UsageError(f"--rebuild needs a source checkout; {r} is an installed artifact root")
    archs = list(arch) or (V.installed_archs(r) if mode == V.INSTALLED else list(ALL_ARCHS))
    problems = V.verify(r, archs, mode=mode)
    if rebuild and not problems:
        problems = V.rebuild_compare(r, archs, jobs=jobs)
    lines, repair = _stale_summary(problems)
    for p in lines:
        click.echo(f"DRIFT {p}", err=True)
    if repair:
        click.echo(repair, err=True)
    note = f" [{V.INSTALLED_NOTE}: {r}]" if mode == V.INSTALLED else ""
    if problems:
        click.echo(f"vkc verify: {len(problems)} problem(s){note}", err=True)
        sys.exit(1)
    click.echo(f"vkc verify: clean ({', '.join(archs)}{'; rebuilt byte-identical' if rebuild else ''}){note}")


@main.command("inspect")
@_arch_option("only these archs (repeat or comma-separate)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.option("--root", type=click.Path(file_okay=False), default=None)
def inspect_cmd(arch: list[str], as_json: bool, root: str | None) -> None:
    """What is vendored per arch: kernels, sizes, registers, spills, shared memory."""
    from vkc import kinds, manifest  # noqa: PLC0415

    r, mode = _artifact_root(root)
    archs = list(arch) or ([a for a in ALL_ARCHS if manifest.manifest_path(r, a).is_file()] if mode == "installed"
                           else list(ALL_ARCHS))
    rows = []
    for a in archs:
        p = manifest.manifest_path(r, a)
        if not p.is_file():
            rows.append({"arch": a, "missing": True})
            continue
        doc = manifest.load(p)
        for base, k in sorted(doc["kernels"].items()):
            if kinds.kind_of(k) != "triton-cubin":  # host-code kinds: files, no per-kernel resources
                rows.append({"arch": a, "base": base, "kind": kinds.kind_of(k),
                             "registers": (k.get("launch") or {}).get("registers", 0), "spills": False,
                             "size": sum(x["size"] for x in k["artifacts"]), "shared": 0, "num_warps": 0,
                             "verified": "runtime" if a in RUNTIME_VERIFIED else "build"})
                continue
            R = k["resources"]
            rows.append({"arch": a, "base": base, "kind": kinds.kind_of(k), "size": k["artifact"]["size"],
                         "registers": R["registers"],
                         "spills": R["spills"], "stack": R["stack"], "local": R["local"],
                         "shared": k["launch"]["shared"] + R["shared_static"], "num_warps": k["launch"]["num_warps"],
                         "verified": "runtime" if a in RUNTIME_VERIFIED else "build"})
    if as_json:
        click.echo(json.dumps(rows, indent=1))
        return
    if mode == "installed":
        click.echo(f"installed artifacts: {r}")
    for a in archs:
        mine = [x for x in rows if x["arch"] == a]
        if mine and mine[0].get("missing"):
            click.echo(f"{a}: no manifest (vkc regen --arch {a})")
            continue
        total = sum(x["size"] for x in mine)
        regs = [x["registers"] for x in mine]
        click.echo(f"{a} ({ARCHS[a].example}; {mine[0]['verified'] if mine else 'build'}-verified): "
                   f"{len(mine)} kernels, {total / 1024:.1f} KiB, registers {min(regs, default=0)}-"
                   f"{max(regs, default=0)}, spills {sum(x['spills'] for x in mine)}")
        for x in mine:
            click.echo(f"  {x['base']:<44} {x['size']:>8} B  REG {x['registers']:>3}  warps {x['num_warps']:>2}  "
                       f"smem {x['shared']:>6}  {'SPILLS' if x['spills'] else 'no spills'}")


@main.group()
def tune() -> None:
    """AOT tuning: build candidates (CPU), time them (GPU), apply the winners as tuning data for regen; `plans`:
    GEMM tactic plans for the runtime (GPU)."""


@tune.command("build")
@click.option("--arch", required=True, type=ARCH_CHOICE)
@click.option("--family", required=True)
@click.option("--knob", required=True, help="num_warps | num_stages | constexprs.<NAME>")
@click.option("--values", required=True, help="comma-separated integers, e.g. 4,8,16")
@click.option("--specs", required=True, help="comma-separated fnmatch patterns of spec names")
@click.option("--out", required=True, type=click.Path(file_okay=False))
@click.option("--set", "fixed", multiple=True, help="KNOB=VALUE held fixed in every candidate, e.g. num_stages=2")
@click.option("--root", type=click.Path(file_okay=False), default=None)
def tune_build(arch, family, knob, values, specs, out, fixed, root) -> None:
    """Regenerate ARCH once per knob value into OUT/<knob><value>/ (candidates that spill are rejected)."""
    from vkc import tune as T  # noqa: PLC0415

    fixed_d = {}
    for item in fixed:
        k, _, v = item.partition("=")
        try:
            fixed_d[k] = int(v)
        except ValueError:
            raise click.BadParameter(f"expected KNOB=INTEGER, got {item!r}", param_hint="--set") from None
    try:
        ints = [int(v) for v in values.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {values!r}", param_hint="--values") from None
    made = T.build(_root(root), arch, family, knob, ints, specs.split(","),
                   Path(out).resolve(), log=click.echo, fixed=fixed_d)
    if not made:
        click.echo("vkc tune build: no candidate compiled", err=True)
        sys.exit(1)


@tune.command("run")
@click.argument("tune_dir", type=click.Path(exists=True, file_okay=False))
@click.option("--bench", required=True, type=click.Path(exists=True, dir_okay=False),
              help="family benchmark printing JSON rows {spec, case, us}, e.g. benchmarks/tune_norm.py")
@click.option("--out", required=True, type=click.Path(dir_okay=False))
def tune_run(tune_dir, bench, out) -> None:
    """Time every candidate of TUNE_DIR on this machine's GPU (each in a fresh process)."""
    from vkc import tune as T  # noqa: PLC0415

    res = T.run(Path(tune_dir), Path(bench))
    Path(out).write_text(json.dumps(res, indent=1) + "\n")
    for name, r in res.items():
        click.echo(f"{name}: " + (r["error"][-300:] if "error" in r else
                                  ", ".join(f"{x['spec']}@{x['case']} {x['us']:.1f} us" for x in r["rows"])))
    if any("error" in r for r in res.values()):
        sys.exit(1)


@tune.command("apply")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--mirror", multiple=True, help="SUFFIX_MEASURED:SUFFIX_TWIN, e.g. .a16:.any")
@click.option("--root", type=click.Path(file_okay=False), default=None)
def tune_apply(results, mirror, root) -> None:
    """Write the fastest candidate per spec into kernels_src/<family>/tuning/<arch>.json (then run regen).
    RESULTS: one or more `vkc tune run` outputs (e.g. one per fixed num_warps), compared together."""
    from vkc import tune as T  # noqa: PLC0415

    merged = {}
    for f in results:
        for name, r in json.loads(Path(f).read_text()).items():
            merged[f"{Path(f).stem}/{name}" if len(results) > 1 else name] = r
    choices = T.choose(merged)
    pairs = [tuple(m.split(":", 1)) for m in mirror]
    for spec, c in choices.items():
        others = ", ".join(f"{n} {t:.1f}" for n, t in c["geomean_us"].items())
        click.echo(f"{c['family']}.{spec} ({c['arch']}): {c['knob']}={c['value']}   geomean us: {others}")
    for path in T.apply(_root(root), choices, pairs):
        click.echo(f"wrote {path}; now run `vkc regen --arch ...` and commit")


@tune.command("plans")
@click.option("--shape", "shapes", multiple=True, metavar="M,N,K",
              help="a GEMM to plan (repeatable); with --write-defaults and no --shape: every M bucket of the shapes "
                   "the committed default covers (vkc_runtime.plans.defaults.COVERED_NK)")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="plan file (default: VKC_PLAN_CACHE, else the per-fingerprint XDG cache path)")
@click.option("--write-defaults", "defaults_out", type=click.Path(dir_okay=False), default=None,
              help="write the winners as a committed default plan (the format of "
                   "runtime/vkc_runtime/plans/defaults/<arch>.json) to this path; every key is timed here, no plan "
                   "file is read or written")
def tune_plans(shapes, out, defaults_out) -> None:
    """Time every GEMM tactic for each shape's key on this GPU and publish the winners into a plan file (GPU;
    the committed default plan is bypassed, keys already in the file are kept), or, with --write-defaults, into
    a default plan for the arch (then commit it as runtime/vkc_runtime/plans/defaults/<arch>.json)."""
    if out and defaults_out:
        raise click.UsageError("--out and --write-defaults exclude each other (a default plan is timed from scratch)")
    if not shapes and not defaults_out:
        raise click.UsageError("name --shape M,N,K (repeatable), or --write-defaults PATH")
    parsed = []
    for s_ in shapes:
        try:
            m, n, k = (int(v) for v in s_.split(","))
        except ValueError:
            raise click.BadParameter(f"expected M,N,K integers, got {s_!r}", param_hint="--shape") from None
        parsed.append((m, n, k))
    if out:
        os.environ["VKC_PLAN_CACHE"] = str(Path(out).resolve())
    # --write-defaults: mode off (no file read or written: every key is timed by this run), defaults off
    os.environ["VKC_PLAN_CACHE_MODE"] = "off" if defaults_out else "readwrite"
    os.environ["VKC_PLAN_DEFAULTS"] = "0"
    from vkc_runtime import plans  # noqa: PLC0415
    from vkc_runtime.plans import defaults as D  # noqa: PLC0415
    from vkc_runtime.plans.keys import M_BUCKETS  # noqa: PLC0415

    if not parsed:
        parsed = plans.declared(D.COVERED_NK, M_BUCKETS[-1])
    rep = plans.warmup_gemm(parsed, log=click.echo)
    c = plans.cache_for_context()
    if defaults_out:
        p = Path(defaults_out)
        p.write_bytes(D.tuned_document(c.meta, c.native_entries().values(), "vkc tune plans --write-defaults"))
        _, got = D.read(c.arch, p)  # the file validates as a default plan of this runtime
        click.echo(f"vkc tune plans: tuned {rep['tuned']} keys, wrote {len(got)} default plans -> {p} (commit it as "
                   f"runtime/vkc_runtime/plans/defaults/{c.arch}.json)")
    else:
        click.echo(f"vkc tune plans: tuned {rep['tuned']}, loaded {rep['loaded']}, saved {rep['saved']} -> "
                   f"{rep['path']}")
    for key, tid in c.selected().items():
        click.echo(f"  {key}: tactic {tid}")


def _plan_settings(frozen: bool, plans_file: str | None) -> None:
    """``--frozen-plans`` / ``--plans-file`` of generate and serve, mapped onto the VKC_PLAN_* settings that
    vkc_runtime.plans reads (the one mechanism), then checked: a bad setting, or a frozen run whose named plan file
    does not exist, is a one-line error before anything is loaded."""
    if plans_file:
        os.environ["VKC_PLAN_CACHE"] = str(Path(plans_file).expanduser().resolve())
    if frozen:
        os.environ["VKC_PLAN_CACHE_MODE"] = "frozen"
    from vkc_runtime.plans import config  # noqa: PLC0415

    try:
        cfg = config.from_env()
    except config.PlanConfigError as e:
        raise click.ClickException(f"GEMM plan settings: {e}") from None
    if cfg.mode == "frozen" and cfg.path is not None and not cfg.path.is_file():
        raise click.ClickException(
            f"frozen GEMM plans: plan file {cfg.path} does not exist (a run without --frozen-plans tunes and saves "
            f"it, as does `vkc tune plans --out {cfg.path} --shape M,N,K ...`)")


def _plan_options(f):
    f = click.option("--plans-file", type=click.Path(dir_okay=False), default=None,
                     help="the GEMM plan file (VKC_PLAN_CACHE; default: the per-fingerprint path under "
                          "$XDG_CACHE_HOME or ~/.cache)")(f)
    return click.option("--frozen-plans", is_flag=True,
                        help="read-only GEMM plans (VKC_PLAN_CACHE_MODE=frozen, for benchmarks): a GEMM the plan "
                             "file and the default plan do not cover fails at start; nothing is tuned or written")(f)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="print the report as JSON (with its verdict)")
@click.option("--deep", is_flag=True, help="also sha256 every artifact")
def doctor(as_json: bool, deep: bool) -> None:
    """Device, driver, selected arch and artifact completeness (works without a GPU).

    \b
    Exit status:
      0  this installation can run its kernels on this machine
      1  it cannot, whatever the device: no artifact root, a broken or incomplete
         artifact set, no arch for this device (the last line says why)
      3  the artifacts are complete but there is no usable CUDA driver or
         device here (a CPU-only machine)
    """
    # doctor reports missing kernels itself: importing vkc_runtime must not refuse first
    os.environ.setdefault("VKC_IMPORT_CHECK", "0")
    from vkc_runtime import doctor as D  # noqa: PLC0415

    rep = D.report(deep=deep)
    code, reasons = D.verdict(rep)
    if as_json:
        rep["verdict"] = {"exit": code, "reasons": reasons}
        click.echo(json.dumps(rep, indent=1, default=str))
    else:
        click.echo(D.format_report(rep))
        if code == D.EXIT_OK:
            click.echo(f"vkc doctor: OK, can run on this machine ({rep['selected']['arch']})")
        else:
            what = "cannot run here" if code == D.EXIT_BROKEN else "artifacts complete, but cannot run here"
            click.echo(f"vkc doctor: {what}: {'; '.join(reasons)}", err=True)
    sys.exit(code)


@main.command()
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="an HF model directory (config.json, *.safetensors, tokenizer.json)")
@click.option("--prompt", "prompts", multiple=True, required=True, help="prompt text (repeatable: one batch)")
@click.option("--max-tokens", type=click.IntRange(min=1), default=128, show_default=True)
@click.option("--temperature", type=click.FloatRange(min=0), default=0.0, show_default=True, help="0: greedy")
@click.option("--top-p", type=click.FloatRange(0, 1, min_open=True), default=1.0, show_default=True)
@click.option("--top-k", type=click.IntRange(min=-1), default=0, show_default=True, help="0 or -1: off")
@click.option("--min-p", type=click.FloatRange(0, 1), default=0.0, show_default=True)
@click.option("--seed", type=int, default=None)
@click.option("--stop", multiple=True, help="stop string (repeatable)")
@click.option("--ignore-eos", is_flag=True)
@click.option("--max-model-len", type=click.IntRange(min=2), default=4096, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=8, show_default=True)
@click.option("--max-num-batched-tokens", type=click.IntRange(min=16), default=2048, show_default=True)
@click.option("--memory-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.85, show_default=True,
              help="share of the free device memory (after weights) for the KV cache and GDN states")
@click.option("--load-format", type=click.Choice(["safetensors", "dummy"]), default="safetensors", show_default=True,
              help="dummy: random weights of config.json's shapes (speed runs without a checkpoint)")
@click.option("--enforce-eager", is_flag=True, help="no CUDA graphs: every step runs op by op")
@click.option("--dequantize-experts", is_flag=True,
              help="FP8 / NVFP4 MoE checkpoints: dequantize the experts to bf16 at load (more memory) instead of "
                   "running them quantized")
@_plan_options
def generate(model_dir, prompts, max_tokens, temperature, top_p, top_k, min_p, seed, stop, ignore_eos,
             max_model_len, max_num_seqs, max_num_batched_tokens, memory_fraction, load_format,
             enforce_eager, dequantize_experts, frozen_plans, plans_file) -> None:
    """Generate text with the vkc engine (needs a GPU). One prompt streams to the terminal; several print in
    order once done."""
    _plan_settings(frozen_plans, plans_file)
    from vkc_engine import LLM, SamplingParams  # noqa: PLC0415

    bar = {}

    def progress(done: int, total: int) -> None:
        if "bar" not in bar:
            bar["bar"] = click.progressbar(length=total, label="loading weights", file=sys.stderr)
            bar["bar"].__enter__()
            bar["n"] = 0
        bar["bar"].update(done - bar["n"])
        bar["n"] = done

    t0 = time.perf_counter()
    try:
        llm = LLM(model_dir, max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                  max_num_batched_tokens=max_num_batched_tokens, memory_fraction=memory_fraction,
                  load_format=load_format, progress=progress, enforce_eager=enforce_eager,
                  quantized_experts=not dequantize_experts, log=lambda m: click.echo(m, err=True))
    finally:
        if "bar" in bar:
            bar["bar"].__exit__(None, None, None)
    click.echo(f"loaded in {time.perf_counter() - t0:.1f} s", err=True)
    sp = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p, max_tokens=max_tokens,
                        seed=seed, stop=list(stop), ignore_eos=ignore_eos)
    t1 = time.perf_counter()
    if len(prompts) == 1:
        def stream(outs):
            for o in outs:
                if o.delta_text:
                    click.echo(o.delta_text, nl=False)
                    sys.stdout.flush()  # partial lines show as they come
        outs = llm.generate(list(prompts), sp, on_output=stream)
        click.echo()
    else:
        outs = llm.generate(list(prompts), sp)
        for i, o in enumerate(outs):
            click.echo(f"--- [{i}] {o.prompt!r}\n{o.text}")
    n = sum(len(o.token_ids) for o in outs)
    dt = time.perf_counter() - t1
    click.echo(f"{n} tokens in {dt:.2f} s ({n / max(dt, 1e-9):.1f} tok/s); finish: "
               f"{', '.join(str(o.finish_reason) for o in outs)}", err=True)


@main.command()
@click.option("--model", "model_dir", required=True, type=click.Path(exists=True, file_okay=False),
              help="an HF model directory (config.json, *.safetensors, tokenizer.json, chat template)")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True)
@click.option("--max-num-seqs", type=click.IntRange(min=1), default=32, show_default=True)
@click.option("--max-model-len", type=click.IntRange(min=2), default=None, help="default: the config's, at most 32768")
@click.option("--max-num-batched-tokens", type=click.IntRange(min=16), default=2048, show_default=True)
@click.option("--gpu-memory-fraction", type=click.FloatRange(0, 1, min_open=True), default=0.85, show_default=True,
              help="share of the free device memory (after weights) for the KV cache and GDN states")
@click.option("--served-model-name", default=None, help="the model name clients send (default: the directory name)")
@click.option("--api-key", default=None, envvar="VKC_API_KEY", help="require 'Authorization: Bearer KEY' on /v1/*")
@click.option("--max-waiting", type=click.IntRange(min=0), default=256, show_default=True,
              help="requests allowed to wait for admission before new ones get 503")
@click.option("--load-format", type=click.Choice(["safetensors", "dummy"]), default="safetensors", show_default=True)
@click.option("--dequantize-experts", is_flag=True,
              help="FP8 / NVFP4 MoE checkpoints: dequantize the experts to bf16 at load (more memory) instead of "
                   "running them quantized")
@_plan_options
def serve(model_dir, host, port, max_num_seqs, max_model_len, max_num_batched_tokens, gpu_memory_fraction,
          served_model_name, api_key, max_waiting, load_format, dequantize_experts, frozen_plans, plans_file) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (/v1/completions, /v1/chat/completions, /v1/models,
    /health, /metrics) until SIGTERM or Ctrl-C (needs a GPU and the `serve` extra)."""
    _plan_settings(frozen_plans, plans_file)
    try:
        from vkc_server import serve as run  # noqa: PLC0415
    except ImportError as e:
        raise click.ClickException(f"vkc serve needs the serve extra (pip install 'vkc[serve]'): {e}") from None
    run(model_dir, host=host, port=port, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
        max_num_batched_tokens=max_num_batched_tokens, memory_fraction=gpu_memory_fraction,
        served_model_name=served_model_name, api_key=api_key, max_waiting=max_waiting, load_format=load_format,
        quantized_experts=not dequantize_experts, log=lambda m: click.echo(m, err=True))


if __name__ == "__main__":
    main()
