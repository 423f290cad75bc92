"""tools/variant_root.py: a patch that misses or matches twice stops the build (a silent miss would time the head
as the variant); the root holds only the picked artifacts and the manifest (regen stubbed)."""
import importlib.util
import json
import pathlib

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture()
def vr():
    spec = importlib.util.spec_from_file_location("variant_root", REPO / "tools" / "variant_root.py")
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


def test_replace_once(vr, tmp_path):
    f = tmp_path / "k.py"
    f.write_text("a = 1\nb = 2\nb = 2\n")
    vr.replace_once(f, "a = 1\n", "a = 3\n")
    assert f.read_text() == "a = 3\nb = 2\nb = 2\n"
    with pytest.raises(SystemExit, match="found 2"):
        vr.replace_once(f, "b = 2\n", "b = 4\n")
    with pytest.raises(SystemExit, match="found 0"):
        vr.replace_once(f, "c = 5\n", "")
    assert f.read_text() == "a = 3\nb = 2\nb = 2\n"


def test_build_picks_artifacts(vr, tmp_path, monkeypatch):
    seen = {}

    def fake_regen(cmd, cwd, **kw):  # what regen would write for sm_90a
        tree = pathlib.Path(cmd[3])
        seen["patched"] = (tree / "kernels_src" / "MARK").exists()
        d = tree / "vendored/sm_90a/gemv"
        d.mkdir(parents=True)
        for n in ("bf16.m1.n4.k1024.cubin", "w8a16.m1.n8.k512.cubin"):
            (d / n).write_bytes(n.encode())
        man = {"kernels": {f"gemv.{n[:-6]}": {"artifact": {"path": f"vendored/sm_90a/gemv/{n}"},
                                                "resources": {"registers": 40}} for n in ("bf16.m1.n4.k1024.cubin",
                                                                                          "w8a16.m1.n8.k512.cubin")}}
        (tree / "manifests/sm_90a.json").write_text(json.dumps(man))

    monkeypatch.setattr(vr.subprocess, "run", fake_regen)
    root = vr.build("V", lambda t: (t / "kernels_src" / "MARK").write_text(""), ["gemv/bf16.m1.*.cubin"],
                    work=tmp_path)
    assert seen["patched"]
    assert sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()) == [
        "manifests/sm_90a.json", "vendored/sm_90a/gemv/bf16.m1.n4.k1024.cubin"]
    with pytest.raises(SystemExit, match="no artifact"):
        vr.build("W", lambda t: None, ["gemv/nothing.*"], work=tmp_path)
