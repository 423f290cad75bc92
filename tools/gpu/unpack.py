"""Split the results.json that tools/gpu/run.sh returns into one file per benchmark (for benchmarks/results/)."""
import json
import pathlib
import sys

src, dst = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for name, val in json.loads(src.read_text()).items():
    p = dst / name
    if name.endswith(".jsonl"):
        p.write_text("".join(json.dumps(v) + "\n" for v in val))
    elif isinstance(val, str):
        p.write_text(val)
    else:
        p.write_text(json.dumps(val, indent=1) + "\n")
    print(p)
