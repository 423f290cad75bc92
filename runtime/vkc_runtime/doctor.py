"""``vkc_runtime.doctor``: what this installation can run, and why not.

``python -m vkc_runtime.doctor [--deep] [--json]``. Works without a GPU or driver. Exit status (:func:`verdict`):
0 this installation can run its kernels on this machine; 1 it cannot (no artifact root, a broken or incomplete
artifact set, no arch for this device); 3 the artifacts are complete but this machine has no usable CUDA
driver or device.
"""
from __future__ import annotations


import json
import os
import platform
import sys
from typing import Any

from vkc_contract import arch as _arch

__all__ = ["report", "format_report", "verdict", "main"]

EXIT_OK, EXIT_BROKEN, EXIT_NO_DEVICE = 0, 1, 3


def _native_info() -> dict[str, Any]:
    from . import native
    info: dict[str, Any] = {"available": native.native_available(), "reason": native.native_reason()}
    if native.NATIVE is not None:
        info["path"] = getattr(native.NATIVE, "__file__", None)
        try:
            info["driver"] = native.NATIVE.driver_status()
        except Exception:  # pragma: no cover
            pass
    return info


def report(deep: bool = False) -> dict[str, Any]:
    """A JSON-able description of runtime, driver, devices and artifacts. ``deep``: sha256 every artifact."""
    from . import __version__, artifacts, driver, registry

    r: dict[str, Any] = {
        "vkc_runtime": {"version": __version__, "path": os.path.dirname(os.path.abspath(__file__))},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "env": {k: v for k, v in sorted(os.environ.items())
                if k.startswith("VKC_") or k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")},
    }
    try:
        import cuda.bindings as _cb
        r["cuda_bindings"] = getattr(_cb, "__version__", "?")
    except Exception as e:  # pragma: no cover
        r["cuda_bindings"] = f"unavailable: {e}"
    r["native"] = _native_info()

    # driver and devices
    drv: dict[str, Any] = {"available": False, "version": None, "reason": None}
    devices: list[dict[str, Any]] = []
    try:
        driver.init()
        drv["available"] = True
        try:
            v = driver.driver_version()
            drv["version"] = v
            drv["cuda"] = f"{v // 1000}.{(v % 1000) // 10}"
        except Exception as e:
            drv["version_error"] = str(e)
        for d in range(driver.device_count()):
            dev: dict[str, Any] = {"ordinal": d}
            try:
                cc = driver.device_cc(d)
                dev.update(name=driver.device_name(d), cc=f"{cc[0]}.{cc[1]}", sm_count=driver.sm_count(d),
                           max_smem_optin=driver.max_smem_optin(d),
                           archs=_arch.candidates_for_cc(cc))
            except Exception as e:
                dev["error"] = str(e)
            devices.append(dev)
    except Exception as e:
        drv["reason"] = str(e)
    r["driver"] = drv
    r["devices"] = devices

    # artifacts
    root = None
    try:
        root, how = artifacts.find_root_info()
        r["artifact_root"] = {"path": str(root) if root else None, "how": how}
    except Exception as e:
        r["artifact_root"] = {"path": None, "how": None, "error": str(e)}
    try:
        req = sorted(registry.required())  # imports the ops modules, which declare the bases they launch
    except Exception as e:  # pragma: no cover - reported, never fatal for doctor
        r["ops_import_error"] = f"{type(e).__name__}: {e}"
        req = sorted(registry.required(include_ops=False))
    r["required"] = req

    sel: dict[str, Any] = {"arch": None, "how": None}
    cc0 = None
    if devices and "cc" in devices[0]:
        cc0 = tuple(int(x) for x in devices[0]["cc"].split("."))
    try:
        if cc0 is not None or os.environ.get("VKC_ARCH"):
            sel["arch"], sel["how"] = artifacts.select_arch_info(cc0, root)
        else:
            sel["error"] = "no device: nothing to select (set VKC_ARCH to force one)"
    except Exception as e:
        sel["error"] = str(e)
    r["selected"] = sel
    r["selected_arch"] = sel.get("arch")  # flat alias (benchmarks record it)

    per: dict[str, Any] = {}
    for a in _arch.ALL_ARCHS:
        e: dict[str, Any] = {"manifest": False}
        if root is not None and artifacts.manifest_path(root, a).is_file():
            e["manifest"] = True
            try:
                aset = artifacts.ArtifactSet(root, a)
                e["kernels"] = len(aset.kernels)
                e["problems"] = aset.check_complete(aset.bases())
                e["complete"] = not e["problems"]
                e["required_missing"] = sorted({p.split(":", 1)[0] for p in aset.check_complete(req)})
                if deep:
                    e["hash_problems"] = aset.check_hashes()
                    e["complete"] = e["complete"] and not e["hash_problems"]
            except Exception as ex:
                e["error"] = str(ex)
                e["complete"] = False
        per[a] = e
    r["arches"] = per
    if sel.get("arch"):
        r["required_missing"] = per.get(sel["arch"], {}).get("required_missing", req)
    else:
        r["required_missing"] = None
    r["import_check"] = registry.last_check()
    try:
        from . import plans
        r["plans"] = plans.status(resolve=True)  # reads the plan file this process would use; writes nothing
    except Exception as e:  # pragma: no cover - reported, never fatal for doctor
        r["plans"] = {"error": f"{type(e).__name__}: {e}"}
    return r


def verdict(r: dict[str, Any]) -> tuple[int, list[str]]:
    """``(exit status, reasons)`` for a :func:`report`: EXIT_OK, EXIT_BROKEN (the installation cannot run here,
    whatever the device) or EXIT_NO_DEVICE (the artifacts are complete; no usable CUDA driver/device here)."""
    broken: list[str] = []
    ar = r["artifact_root"]
    if not ar.get("path"):
        broken.append(f"no artifact root ({ar.get('error') or 'none found'})")
    if r.get("ops_import_error"):
        broken.append(f"vkc_runtime.ops does not import: {r['ops_import_error']}")
    if (r.get("plans") or {}).get("config_error"):
        broken.append(f"GEMM plan settings: {r['plans']['config_error']}")

    def arch_problems(a: str) -> list[str]:
        e = r["arches"].get(a, {})
        if not e.get("manifest"):
            return [f"{a}: no manifest"]
        if "error" in e:
            return [f"{a}: manifest error: {e['error']}"]
        out = []
        if e.get("required_missing"):
            out.append(f"{a}: {len(e['required_missing'])} required kernel(s) missing, e.g. {e['required_missing'][0]}")
        bad = e.get("problems", []) + e.get("hash_problems", [])
        if bad:
            out.append(f"{a}: {len(bad)} artifact problem(s), e.g. {bad[0]}")
        return out

    sel = r["selected"].get("arch")
    devices = [d for d in r["devices"] if "cc" in d]
    if ar.get("path"):
        if sel:
            broken += arch_problems(sel)
        elif devices:
            broken.append(f"device 0 (cc {devices[0]['cc']}): no usable arch ({r['selected'].get('error')})")
        else:  # no device to select for: every arch this installation ships must be usable
            shipped = [a for a, e in r["arches"].items() if e.get("manifest")]
            if not shipped:
                broken.append(f"no arch has a manifest under {ar['path']}")
            for a in shipped:
                broken += arch_problems(a)
    if broken:
        return EXIT_BROKEN, broken
    if not r["driver"]["available"]:
        return EXIT_NO_DEVICE, [f"no CUDA driver ({r['driver'].get('reason')})"]
    if not devices:
        errs = [d["error"] for d in r["devices"] if "error" in d]
        return EXIT_NO_DEVICE, [f"no usable CUDA device ({errs[0] if errs else 'the driver reports none'})"]
    return EXIT_OK, []


def format_report(r: dict[str, Any]) -> str:
    """Human-readable form of :func:`report`."""
    out: list[str] = []
    w = out.append
    w(f"vkc_runtime {r['vkc_runtime']['version']}  ({r['vkc_runtime']['path']})")
    w(f"python {r.get('python')}  cuda-bindings {r.get('cuda_bindings')}  {r.get('platform', '')}")
    n = r["native"]
    w(f"native launcher: {'yes' if n['available'] else 'no'}" + (f" ({n['reason']})" if n.get("reason") else "")
      + (f"  libcuda: {n['driver']}" if n.get("driver") else ""))
    d = r["driver"]
    if d["available"]:
        w(f"driver: available, CUDA {d.get('cuda', '?')} ({d.get('version')})")
    else:
        w(f"driver: unavailable ({d.get('reason')})")
    for dev in r["devices"]:
        if "error" in dev:
            w(f"  device {dev['ordinal']}: error {dev['error']}")
        else:
            w(f"  device {dev['ordinal']}: {dev['name']}  cc {dev['cc']}  {dev['sm_count']} SMs  "
              f"smem opt-in {dev['max_smem_optin']} B  usable archs: {', '.join(dev['archs']) or 'none'}")
    ar = r["artifact_root"]
    w(f"artifact root: {ar.get('path') or 'none'}" + (f" ({ar['how']})" if ar.get("how") else "")
      + (f"  ERROR {ar['error']}" if ar.get("error") else ""))
    s = r["selected"]
    if s.get("arch"):
        w(f"selected arch: {s['arch']} ({s['how']})")
    else:
        w(f"selected arch: none ({s.get('error')})")
    w("arches:")
    for a, e in r["arches"].items():
        if not e["manifest"]:
            w(f"  {a:8s} no manifest")
            continue
        if "error" in e:
            w(f"  {a:8s} manifest ERROR: {e['error']}")
            continue
        status = "complete" if e.get("complete") else "INCOMPLETE"
        w(f"  {a:8s} {e['kernels']} kernels, {status}" + (" (hashes checked)" if "hash_problems" in e else ""))
        for p in e.get("problems", [])[:20] + e.get("hash_problems", [])[:20]:
            w(f"           - {p}")
        if e.get("required_missing"):
            w(f"           required but missing: {', '.join(e['required_missing'])}")
    w(f"required kernels: {len(r['required'])}" + (
        f"; missing for the selected arch: {', '.join(r['required_missing']) or 'none'}"
        if r.get("required_missing") is not None else ""))
    ic = r.get("import_check") or {}
    w(f"import check: {ic.get('status')}" + (f" ({ic['reason']})" if ic.get("reason") else ""))
    w(_plans_line(r.get("plans") or {}, s.get("arch")))
    if r["env"]:
        w("env: " + "  ".join(f"{k}={v}" for k, v in r["env"].items()))
    return "\n".join(out)


def _plans_line(p: dict[str, Any], arch: str | None) -> str:
    """The GEMM plan cache in one line: mode, the native file (path, state, fingerprint), the tune delay, the
    selected arch's tactics and default plan; then one line per cache started in this process."""
    if "error" in p:
        return f"gemm plans: ERROR {p['error']}"
    if "config_error" in p:
        return f"gemm plans: bad setting: {p['config_error']}"
    c, f = p["config"], p.get("file") or {}
    if f.get("path") or f.get("fingerprint"):
        state = f.get("file", "?")
        if state == "valid":
            state = f"valid, {f.get('plans')} plans"
        elif state == "rejected":
            state = f"rejected: {f.get('reason')}"
        where = f"{f.get('path') or 'process-local'} ({state}), fingerprint {f.get('fingerprint')}"
    else:
        where = c["path"] or (f"{p['cache_root']}/vkc/gemm_plans/... (per compatibility fingerprint)"
                              if p["cache_root"] else "process-local (no cache root)")
        why = f.get("unavailable") or f.get("error")
        where += f" (state and fingerprint unknown: {why})" if why else ""
    line = f"gemm plans: mode {c['mode']}, file {where}, tune delay {c['delay_us']} us"
    if c["flashinfer"]:
        line += f", FlashInfer import {c['flashinfer']}"
    if arch and arch in p.get("defaults", {}):
        d = p["defaults"][arch]
        ts = p["tactics"].get(arch, {})
        line += (f"; {arch}: {ts.get('count', 0)} tactics (digest {str(ts.get('digest'))[:12]}), default plan "
                 + (f"ERROR {d['error']}" if "error" in d else f"{d['plans']} plans" if c["defaults"] else "off"))
    for cache in p.get("caches", []):
        line += (f"\n  started: {cache['arch']} {cache['mode']} {cache['path']} fingerprint {cache['fingerprint']} "
                 f"loaded {cache['loaded']} tuned {cache['tuned']} rejected {cache['rejected']} saved {cache['saved']}")
    return line


def main(argv=None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m vkc_runtime.doctor", description=__doc__)
    p.add_argument("--deep", action="store_true", help="sha256 every artifact")
    p.add_argument("--json", action="store_true", help="print JSON")
    a = p.parse_args(argv)
    r = report(deep=a.deep)
    code, reasons = verdict(r)
    r["verdict"] = {"exit": code, "reasons": reasons}
    print(json.dumps(r, indent=1, sort_keys=True, default=str) if a.json else format_report(r))
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
