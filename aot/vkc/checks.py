"""The registry of `vkc verify` checks: one id and one message template per check.

Every problem verify reports is a :class:`Problem` made by :func:`problem` from a registered id, so each
check's message lives here once and the tests can prove that every check has a mutation test asserting
its own message (``tests/test_verify_mutations.py`` walks this table).
"""
from __future__ import annotations

from typing import Any

# id -> template (``str.format`` fields; ``{arch}`` is always available). One problem = one line that
# names what drifted and how to repair it (``{fix}`` is usually "run `vkc regen --arch A`").
CHECKS: dict[str, str] = {
    # tree level
    "schema-missing": "{schema} is missing; restore it from git",
    "stray-manifest": "manifests/{file} is not a known arch manifest; delete it",
    "stray-arch-dir": "vendored/{dir} is not a known arch; delete it",
    "no-installed-manifest": "the installed artifact root {root} holds no arch manifest; reinstall a vkc wheel "
                             "built with artifacts (VKC_ARCHES=<arch> pip wheel .)",
    # manifest document
    "manifest-missing": "manifest {rel} is missing; {fix}",
    "manifest-json": "{rel} is not valid JSON ({err}); {fix}",
    "schema-violation": "{rel} violates manifests/schema.json at {err}; {fix}",
    "noncanonical": "{rel} is not in canonical form (edited by hand?); {fix}",
    "digest": "{rel} digest mismatch: the manifest was edited after regen; {fix}",
    "manifest-arch": "{rel} says arch {got}; {fix}",
    "target-cc": "target cc {got} != {want}; {fix}",
    # toolchain pins and generator
    "triton-pin": "built with triton {got}, pinned {want}; pip install 'vkc[regen]' and {fix}",
    "python-pin": "built with python {got}, pinned {want}; {fix}",
    "ptxas-pin": "ptxas {got} != pinned {name} {want}; {fix}",
    "line-info": "line info policy differs (manifest {got}, pinned {want}); {fix}",
    "generator": "generator (aot/ sources) changed since regen ({old} -> {new}); {fix}",
    "cutlass-dsl-pin": "CuTe kernels built with {got}, pinned {want}; `make cute-env` and {fix}",
    "cutlass-dsl-unrecorded": "the manifest has CuTe kernels but records no CuTe DSL toolchain; {fix}",
    "cute-shim-changed": "the CuTe driver-API shim {rel} changed since regen; {fix}",
    # sources and specs (source checkout only)
    "source-missing": "source {rel} recorded in the manifest is missing; {fix}",
    "source-changed": "source {rel} changed since regen (stale artifacts); {fix}",
    "source-unrecorded": "source {rel} is imported by a kernel but not recorded; {fix}",
    "specs-unreadable": "cannot read the specs: {err}; fix kernels_src/, then {fix}",
    "source-unscannable": "{name}: cannot scan its source: {err}; fix it, then {fix}",
    "spec-added": "spec {name} has no artifact (added since regen); {fix}",
    "spec-removed": "manifest has {name} but no spec defines it (removed since regen); {fix}",
    "spec-input": "{name}: spec input {key!r} changed ({old!r} -> {new!r}); {fix}",
    "tactics": "GEMM tactic set recorded as {got}, the manifest's kernels give {want}; {fix}",
    "params-signature": "{name}: parameter list does not follow its signature; {fix}",
    "untracked": "{n} file(s) not tracked by git ({shown}); CI clones would miss them: "
                 "run `git add vendored/{arch} manifests/{arch}.json`",
    "extra-file": "extra file {rel} is not in the manifest; delete it or {fix}",
    # every artifact kind
    "kind-loader": "{name}: {rel} is a {kind} artifact, loaded by {want}, but the manifest names loader {got}; {fix}",
    "artifact-path": "{name}: artifact path {rel} != {want}; {fix}",
    "artifact-missing": "{name}: artifact {rel} is missing; {fix}",
    "artifact-modified": "{name}: artifact {rel} was modified (sha256/size mismatch); {fix}",
    # triton-cubin
    "not-cubin": "{name}: {rel} is not a cubin ({err}); {fix}",
    "cubin-sass": "{name}: {rel} holds SASS for sm_{sm}, not {arch}; {fix}",
    "resources-sass": "{name}: resources say SASS {got}; {fix}",
    "launch-name": "{name}: launch name {got} != entry {want}; {fix}",
    "launch-warps-ctas": "{name}: launch num_warps/num_ctas differ from the spec inputs; {fix}",
    "entry-symbol": "{name}: {rel} has no kernel {entry}; {fix}",
    "reqntid": "{name}: cubin requires {got} threads, launch metadata says {want}; {fix}",
    "param-sizes": "{name}: cubin parameter sizes {got} != manifest {want}; {fix}",
    "pack-codes": "{name}: parameter pack codes inconsistent with types; {fix}",
    "spills": "{name}: spills recorded but not allowed by the spec; fix the kernel and {fix}",
    "shared-memory": "{name}: shared memory over {arch}'s limit ({got} B > {limit} B); {fix}",
    # `vkc verify --rebuild`
    "rebuilt-manifest": "rebuilt manifest differs from {rel}; {fix}",
    "rebuilt-artifact": "rebuilt {rel} differs from the committed bytes; {fix}",
    # cute-so (host shared objects)
    "not-shared-object": "{name}: {rel} is not an ELF shared object ({err}); {fix}",
    "host-machine": "{name}: {rel} is built for {got}, but the manifest records host platform {host}; {fix}",
    "missing-symbol": "{name}: {rel} does not export {symbols}; {fix}",
    "host-sass-recorded": "{name}: {rel}: the manifest records SASS {got}, not {arch}'s; {fix}",
    "no-embedded-cubin": "{name}: {rel} embeds no cubin, but the manifest records SASS {want}; {fix}",
    "embedded-sass": "{name}: {rel} embeds SASS for sm_{sm}, not {want}; {fix}",
    "host-needed": "{name}: {rel} needs {libs} (only glibc is allowed: libcuda is opened at run time); {fix}",
    "embedded-cubin-missing": "{name}: {rel} does not embed the kernel's recorded cubin {sha}; {fix}",
}


class Problem(str):
    """One verify finding: the line to print, plus the id of the check that found it."""

    check: str

    def __new__(cls, text: str, check: str) -> "Problem":
        self = super().__new__(cls, text)
        self.check = check
        return self


def problem(check: str, arch: str | None = None, **fields: Any) -> Problem:
    text = CHECKS[check].format(arch=arch, **fields)
    return Problem(f"{arch}: {text}" if arch else text, check)
