"""Process start -> first generated token through the Python API (``vkc_engine.LLM``), in a fresh process per
model, with the phases split out: interpreter start + ``import vkc_engine`` (``import_s``), ``LLM(...)`` (``load_s``:
config, weights, caches, CUDA-graph capture; the engine's own ``load_seconds`` reported next to it), and the first
token of a 128-token prompt (``first_token_s``: one prefill step + sampling). ``total_s`` is measured by the parent
from spawn to the child's first token. Then the same process prefills one long prompt twice (``long_prefill``:
8192 tokens, 2048 for the tiny model): the first run's tok/s against the second's is the figure to set against a
JIT engine's cold-vs-warm gap (nothing is compiled or tuned on the first run here). Models: a tiny random checkpoint (tests/engine_fixtures.py, needs torch +
transformers to make it) and the real shapes with random weights (``load_format="dummy"``, no disk read: their
load time is the device-side weight fill, not a checkpoint read).

    python benchmarks/bench_first_token.py [OUT.json] [--models tiny,27b,35b-a3b]

Prints one JSON object {model: {import_s, load_s, engine_load_seconds, first_token_s, total_s, long_prefill:
{tokens, first_tok_s, second_tok_s}}} and writes it.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CHILD = r"""
import json, sys, time
t_spawn, model_dir, fmt = float(sys.argv[1]), sys.argv[2], sys.argv[3]
from vkc_engine import LLM, SamplingParams
t_imp = time.time()
n_long = int(sys.argv[4])
llm = LLM(model_dir, load_format=fmt, max_num_seqs=64, max_num_batched_tokens=n_long, max_model_len=n_long + 256)
t_load = time.time()
sp = SamplingParams(max_tokens=1, temperature=0.0)
out = llm.generate([list(range(1, 129))], sp)
t_tok = time.time()
assert len(out[0].token_ids) == 1
V = llm.cfg.vocab_size
runs = []
for r in range(2):
    ids = [(7 * i + r) % (V - 1) + 1 for i in range(n_long)]
    t = time.perf_counter()
    llm.generate([ids], sp)  # one prefill step of n_long tokens + one sampled token (returns after a sync)
    runs.append(n_long / (time.perf_counter() - t))
print("RESULT " + json.dumps({"import_s": t_imp - t_spawn, "load_s": t_load - t_imp,
                              "engine_load_seconds": llm.load_seconds, "first_token_s": t_tok - t_load,
                              "total_s": t_tok - t_spawn,
                              "long_prefill": {"tokens": n_long, "first_tok_s": runs[0], "second_tok_s": runs[1]}}))
"""


def _one(model_dir: str, fmt: str, n_long: int) -> dict:
    t0 = time.time()
    p = subprocess.run([sys.executable, "-c", CHILD, repr(t0), model_dir, fmt, str(n_long)], capture_output=True,
                       text=True,
                       timeout=600)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"child failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_path", nargs="?", default=None)
    ap.add_argument("--models", default="tiny,27b,35b-a3b")
    a = ap.parse_args(argv)
    res = {}
    for m in a.models.split(","):
        with tempfile.TemporaryDirectory() as d:
            if m == "tiny":
                from tests.engine_fixtures import make_checkpoint  # noqa: PLC0415
                heads = dict(linear_num_key_heads=16, linear_num_value_heads=48, num_attention_heads=24,
                             num_key_value_heads=4)
                make_checkpoint(d, heads=heads, hidden=512, intermediate=1024, seed=3)
                res[m] = _one(d, "safetensors", 2048)
            else:
                from benchmarks.bench_engine import SHAPES  # noqa: PLC0415
                (Path(d) / "config.json").write_text(json.dumps(SHAPES[m]))
                res[m] = _one(d, "dummy", 8192)
        print(m, json.dumps(res[m]), file=sys.stderr, flush=True)
    txt = json.dumps(res, indent=1)
    print(txt)
    if a.out_path:
        Path(a.out_path).write_text(txt)
    return 0


if __name__ == "__main__":
    sys.exit(main())
