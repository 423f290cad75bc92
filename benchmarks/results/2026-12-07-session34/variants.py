# How session 34's MoE decode variants were built (CPU box), from the tree at bf741a4: python3 variants.py MB
# MB: the bf16 decode kernels (decode.py) with x / h loaded in the weight tile's layout, nothing else changed.
# MGD (gate_up per 128-column block with a scalar scale, x in the tile's layout, [BLOCK_N, 128] accumulators; down
# with h as [S, BN, BK] and the slot's scale as [S, BN]) was built the same way and landed unchanged: its sm_90a
# cubins are byte-identical to the tree at 4190c3a (kernels_src/moe/fp8.py), so that commit is its source.
# MG was MGD's gate_up half alone. The root = the tree's sm_90a moe/decode.* cubins + its manifest.
import json, os, pathlib, shutil, subprocess, sys
root = pathlib.Path('/work/main'); name = sys.argv[1]
assert name == 'MB', 'MGD: build the tree at 4190c3a'
tree = (root / f'build/var-src/{name}/tree').resolve(); shutil.rmtree(tree.parent, ignore_errors=True)
for rel in ("aot", "contract", "runtime", "kernels_src", "csrc"):
    shutil.copytree(root / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
(tree / "manifests").mkdir(); shutil.copy2(root / "manifests/schema.json", tree / "manifests/schema.json")
if name == 'MB':  # the bf16 decode kernels: x / h loaded in the weight tile's layout (per-step sums, tile ahead kept)
    g = tree / 'kernels_src/moe/decode.py'; s = g.read_text()
    s = s.replace('    x_row = x_ptr + t * stride_x + rk\n', '    x_row = x_ptr + t * stride_x + rk[None, :] + n[:, None] * 0\n')
    s = s.replace('''        xk = tl.load(x_row + k0, mask=(k0 + rk) < K, other=0.0).to(tl.float32)''',
                  '''        xk = tl.load(x_row + k0, mask=((k0 + rk) < K)[None, :], other=0.0).to(tl.float32)''')
    s = s.replace('* xk[None, :], axis=1)', '* xk, axis=1)')
    s = s.replace('''    hk = tl.load(h_rows + k0, mask=ok[:, None] & ((k0 + rk) < K)[None, :], other=0.0).to(tl.float32)''',
                  '''    hk = tl.load(h_rows[:, None, :] + (k0 + zn)[None, :, None], mask=(ok[:, None] & ((k0 + rk) < K)[None, :])[:, None, :],
                 other=0.0).to(tl.float32)''')
    s = s.replace('* hk[:, None, :], axis=2)', '* hk, axis=2)')
    s = s.replace('def _down_step(part, w, w_rows, h_rows, ok, wm, rk, k0, K, BLOCK_K: tl.constexpr):',
                  'def _down_step(part, w, w_rows, h_rows, ok, wm, rk, k0, K, zn, BLOCK_K: tl.constexpr):')
    s = s.replace('rk, k0, K, BLOCK_K)', 'rk, k0, K, zn, BLOCK_K)')
    s = s.replace('''    rk = tl.arange(0, BLOCK_K)
    pdl_enter(PDL)
    ok, wt, w_rows, h_rows, wm''', '''    rk = tl.arange(0, BLOCK_K)
    zn = n * 0
    pdl_enter(PDL)
    ok, wt, w_rows, h_rows, wm''')
    assert s.count('zn') == 5, s.count('zn')
    g.write_text(s)
subprocess.run(['/work/main/.venv/bin/python', '-c', 'import sys, pathlib; from vkc import regen; regen.regen(pathlib.Path(sys.argv[1]), ["sm_90a"])', str(tree)],
               cwd=tree, env=dict(os.environ, VKC_CUTE_PYTHON='/work/main/.venv-cute/bin/python'), check=True, capture_output=True)
out = tree.parent / 'root'; (out / 'vendored/sm_90a/moe').mkdir(parents=True); (out / 'manifests').mkdir()
for f in (tree / 'vendored/sm_90a/moe').glob('decode.*.cubin'):
    shutil.copy2(f, out / 'vendored/sm_90a/moe' / f.name)
shutil.copy2(tree / 'manifests/sm_90a.json', out / 'manifests/sm_90a.json')
m = json.loads((out / 'manifests/sm_90a.json').read_text())
print(name, {k: m['kernels'][k]['resources']['registers'] for k in m['kernels'] if 'moe.decode' in k})
