# How call 3's GEMV variants were built (CPU box): B, C, E from the tree at 4aaf287 (= variant A), F from the tree at
# ec5c86c (the old kernel), G (session 34) from 243b971 (same kernel): python3 call3-variants.py {B,C,E,F,G,H}
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
if name in ('G', 'H'):  # H = G at 2 warps; (from the old kernel) per 128-column group: scalar scale, x loaded in the tile's layout, [BN, 128] acc
    old = body[body.index('    acc = tl.zeros((BLOCK_N, BLOCK_K)'):body.index('    y = tl.sum(acc, axis=1)')]
    body = body.replace(old, '''    r128 = tl.arange(0, 128)
    z = n[:, None] * 0
    acc = tl.zeros((BLOCK_N, 128), dtype=tl.float32)
    for k0 in range(k_lo, k_hi, BLOCK_K):
        for g in tl.static_range(BLOCK_K // 128):
            kg0 = k0 + g * 128
            k = kg0 + r128
            k_ok = k < K
            b = tl.load(w_rows + kg0, mask=n_ok[:, None] & k_ok[None, :], other=0)
            if NATIVE:
                w = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            else:
                bi = b.to(tl.int32)
                bits = ((bi & 0x7F) << 7) | ((bi & 0x80) << 8)  # fp16 bits of the e4m3 value * 2^-8
                w = bits.to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            s = tl.load(s_row + kg0 // 128, mask=kg0 < K, other=0.0)
            xg = tl.load(x_ptr + (k[None, :] + z), mask=k_ok[None, :], other=0.0).to(tl.float32)
            acc += w * (xg * s)
''')
    body = body.replace('w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn + rk[None, :]',
                        'w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_wn + tl.arange(0, 128)[None, :]')
assert body != s[k0:k1] or name == 'E', name
g.write_text(s[:k0] + body + s[k1:])
if name in ('E', 'H'):
    sp = tree / 'kernels_src/gemv/spec.py'; t = sp.read_text(); w = {'E': 8, 'H': 2}[name]
    t2 = t.replace('"w8a16": ((8, 512, 4), (4, 1024, 4))}', f'"w8a16": ((8, 512, {w}), (4, 1024, {w}))}}'); assert t2 != t
    sp.write_text(t2)
env = dict(os.environ, VKC_CUTE_PYTHON='/work/main/.venv-cute/bin/python')
subprocess.run(['/work/main/.venv/bin/python', '-c', 'import sys; from vkc import regen; regen.regen(__import__("pathlib").Path(sys.argv[1]), ["sm_90a"])', str(tree.resolve())],
               cwd=tree, env={**env, 'PYTHONPATH': f'{tree}/aot:{tree}/contract:{tree}/runtime:{tree}'}, check=True, capture_output=True)
out = pathlib.Path(f'build/var-src/{name}/root'); (out / 'vendored/sm_90a/gemv').mkdir(parents=True); (out / 'manifests').mkdir()
for f in ('w8a16.m1.n8.k512.cubin', 'w8a16.m1.n4.k1024.cubin'):
    shutil.copy2(tree / 'vendored/sm_90a/gemv' / f, out / 'vendored/sm_90a/gemv' / f)
shutil.copy2(tree / 'manifests/sm_90a.json', out / 'manifests/sm_90a.json')
import json; m = json.loads((out / 'manifests/sm_90a.json').read_text())
print(name, {k: m['kernels'][k]['resources']['registers'] for k in m['kernels'] if k.startswith('gemv.w8a16.m1')})
