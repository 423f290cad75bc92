"""AOT specs of the moe family: this file concatenates the specs of its kernel files (each file's own
``*_spec.py`` defines ``SPECS``; spec.py is loaded by path, so the files are loaded by path too)."""
import importlib.util
from pathlib import Path


def _specs_of(file_name: str) -> list:
    path = Path(__file__).with_name(file_name)
    spec = importlib.util.spec_from_file_location(f"_vkc_spec_moe_{path.stem}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return list(mod.SPECS)


SPECS = _specs_of("grouped_spec.py")
