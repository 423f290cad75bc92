# How session 35's bf16 M = 1 GEMV variants were built (CPU box), from this session's tree (the FP8 M = 1 change
# landed): python3 variants.py {BS,BN,BN4}. Each root = the tree's sm_90a gemv/bf16.m1.* cubin + its manifest.
# BS: gemv_bf16_m1_kernel with per-step sums ([BLOCK_N] fp32 accumulator), the weight tile still loaded one step
#     ahead (the first before the grid-dependency wait).
# BN: BS without the tile ahead (the FP8 M = 1 kernel's landed loop).
# BN4: BN at 4 warps instead of 8 (built after call 3, not yet timed). sm_90a SASS of the K loop: head 2 BAR.SYNC a
#      step (x into the tile's layout; its one reduction after the loop), BS / BN 4 (the per-step sum across warps
#      through shared memory as well), BN4 2; registers head 59, BS / BN 48, BN4 40.
import json, os, pathlib, shutil, subprocess, sys
root = pathlib.Path('/work/main'); name = sys.argv[1]
tree = (root / f'build/var-src/{name}/tree').resolve(); shutil.rmtree(tree.parent, ignore_errors=True)
for rel in ("aot", "contract", "runtime", "kernels_src", "csrc"):
    shutil.copytree(root / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
(tree / "manifests").mkdir(); shutil.copy2(root / "manifests/schema.json", tree / "manifests/schema.json")
g = tree / 'kernels_src/gemv/gemv.py'; s = g.read_text()
k0 = s.index('def gemv_bf16_m1_kernel'); k1 = s.index('@triton.jit\ndef _e2m1_bits')
body = s[k0:k1]
body = body.replace('    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)\n', '    y = tl.zeros((BLOCK_N,), dtype=tl.float32)\n')
body = body.replace('        acc += w.to(tl.float32) * xk.to(tl.float32)[None, :]\n',
                    '        y += tl.sum(w.to(tl.float32) * xk.to(tl.float32)[None, :], axis=1)\n')
body = body.replace('    y = tl.sum(acc, axis=1)\n', '')
if name in ('BN', 'BN4'):
    body = body.replace('''    w = tl.load(w_rows + k_lo, mask=n_ok[:, None] & ((k_lo + rk) < k_hi)[None, :], other=0.0)
''', '')
    body = body.replace('''        xk = tl.load(x_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0)
''', '''        xk = tl.load(x_ptr + k0 + rk, mask=(k0 + rk) < K, other=0.0)
        w = tl.load(w_rows + k0, mask=n_ok[:, None] & ((k0 + rk) < k_hi)[None, :], other=0.0)
''')
    body = body.replace('''        w = tl.load(w_rows + (k0 + BLOCK_K), mask=n_ok[:, None] & ((k0 + BLOCK_K + rk) < k_hi)[None, :], other=0.0)
''', '')
assert 'acc =' not in body and 'acc +=' not in body and body.count('tl.load(w_rows') == (2 if name == 'BS' else 1), body
g.write_text(s[:k0] + body + s[k1:])
if name == 'BN4':
    sp = tree / 'kernels_src/gemv/spec.py'; t = sp.read_text()
    t2 = t.replace('M1_TILES = {"bf16": ((4, 1024, 8),)', 'M1_TILES = {"bf16": ((4, 1024, 4),)'); assert t2 != t
    sp.write_text(t2)
subprocess.run(['/work/main/.venv/bin/python', '-c', 'import sys, pathlib; from vkc import regen; regen.regen(pathlib.Path(sys.argv[1]), ["sm_90a"])', str(tree)],
               cwd=tree, env=dict(os.environ, VKC_CUTE_PYTHON='/work/main/.venv-cute/bin/python'), check=True, capture_output=True)
out = tree.parent / 'root'; (out / 'vendored/sm_90a/gemv').mkdir(parents=True); (out / 'manifests').mkdir()
for f in (tree / 'vendored/sm_90a/gemv').glob('bf16.m1.*.cubin'):
    shutil.copy2(f, out / 'vendored/sm_90a/gemv' / f.name)
shutil.copy2(tree / 'manifests/sm_90a.json', out / 'manifests/sm_90a.json')
m = json.loads((out / 'manifests/sm_90a.json').read_text())
print(name, {k: m['kernels'][k]['resources'] for k in m['kernels'] if k.startswith('gemv.bf16.m1')})
