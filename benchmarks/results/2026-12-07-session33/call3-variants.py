# How call 3's GEMV variants were built (CPU box): B, C, E from the tree at 4aaf287 (= variant A), F from the tree at
# ec5c86c (the old kernel): python3 call3-variants.py {B,C,E,F}
import re, shutil, subprocess, sys, pathlib, os
root = pathlib.Path('/work/main'); name = sys.argv[1]
tree = pathlib.Path(f'build/var-src/{name}/tree'); shutil.rmtree(tree.parent, ignore_errors=True)
for rel in ("aot", "contract", "runtime", "kernels_src", "csrc"):
    shutil.copytree(root / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
(tree / "manifests").mkdir(); shutil.copy2(root / "manifests/schema.json", tree / "manifests/schema.json")
g = tree / 'kernels_src/gemv/gemv.py'; s = g.read_text()
k0 = s.index('def gemv_w8a16_m1_kernel'); k1 = s.index('@triton.jit\ndef gemv_reduce_kernel')
body = s[k0:k1]
if name == 'B':  # full-tile fp32 accumulator, tile ahead, first tile before the wait
    body = body.replace('acc = tl.zeros((BLOCK_N,), dtype=tl.float32)', 'acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)')
    body = body.replace('acc += tl.sum(w * xs[None, :], axis=1)', 'acc += w * xs[None, :]')
    body = body.replace('    y = acc\n', '    y = tl.sum(acc, axis=1)\n')
elif name in ('C',):  # per-step sums, no tile ahead
    body = body.replace('''    b = tl.load(w_rows + k_lo, mask=n_ok[:, None] & ((k_lo + rk) < k_hi)[None, :], other=0)
''', '')
    body = body.replace('''        b_next = tl.load(w_rows + (k0 + BLOCK_K), mask=n_ok[:, None] & ((k0 + BLOCK_K + rk) < k_hi)[None, :],
                         other=0)''', '''        b = tl.load(w_rows + k0, mask=n_ok[:, None] & k_ok[None, :], other=0)''')
    body = body.replace('        b = b_next\n', '')
if name == 'F':  # (from the old kernel) x and the scales loaded as [BLOCK_N, BLOCK_K] tiles in the weight tile's layout
    old = '''        xs = tl.load(x_ptr + k, mask=k_ok, other=0.0).to(tl.float32) * tl.load(s_row + k // 128, mask=k_ok, other=0.0)
        acc += w * xs[None, :]'''
    assert old in body
    body = body.replace(old, '''        z = n[:, None] * 0
        xs = (tl.load(x_ptr + (k[None, :] + z), mask=k_ok[None, :], other=0.0).to(tl.float32)
              * tl.load(s_row + ((k // 128)[None, :] + z), mask=k_ok[None, :], other=0.0))
        acc += w * xs''')
assert body != s[k0:k1] or name == 'E', name
g.write_text(s[:k0] + body + s[k1:])
if name == 'E':
    sp = tree / 'kernels_src/gemv/spec.py'; t = sp.read_text()
    t2 = t.replace('"w8a16": ((8, 512, 4), (4, 1024, 4))}', '"w8a16": ((8, 512, 8), (4, 1024, 8))}'); assert t2 != t; sp.write_text(t2)
env = dict(os.environ, VKC_CUTE_PYTHON='/work/main/.venv-cute/bin/python')
subprocess.run(['/work/main/.venv/bin/python', '-c', 'import sys; from vkc import regen; regen.regen(__import__("pathlib").Path(sys.argv[1]), ["sm_90a"])', str(tree)],
               cwd=tree, env={**env, 'PYTHONPATH': f'{tree}/aot:{tree}/contract:{tree}/runtime:{tree}'}, check=True, capture_output=True)
out = pathlib.Path(f'build/var-src/{name}/root'); (out / 'vendored/sm_90a/gemv').mkdir(parents=True); (out / 'manifests').mkdir()
for f in ('w8a16.m1.n8.k512.cubin', 'w8a16.m1.n4.k1024.cubin'):
    shutil.copy2(tree / 'vendored/sm_90a/gemv' / f, out / 'vendored/sm_90a/gemv' / f)
shutil.copy2(tree / 'manifests/sm_90a.json', out / 'manifests/sm_90a.json')
import json; m = json.loads((out / 'manifests/sm_90a.json').read_text())
print(name, {k: m['kernels'][k]['resources']['registers'] for k in m['kernels'] if k.startswith('gemv.w8a16.m1')})
