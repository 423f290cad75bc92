# How session 34's MoE FP8 decode variants were built (CPU box), from the tree at bf741a4: python3 variants.py MG | MGD | MB
# MB: the bf16 decode kernels (decode.py) with x / h loaded in the weight tile's layout, nothing else changed.
# MGD: MG + moe_w8a16_decode_down_kernel with h loaded in the [S, BN, BK] product's layout, the scale as [S, BN]
# applied to each step's sums.
# MG: moe_w8a16_decode_gate_up_kernel per 128-column group (session 34's G of the dense M = 1 GEMV): a scalar scale
# per group and half, x loaded in the weight tile's layout, [BLOCK_N, 128] accumulators summed once at the end; no
# next tile held ahead. The root = the tree's sm_90a moe/w8a16.decode.gate_up.* cubins + its manifest.
import json, os, pathlib, shutil, subprocess, sys
root = pathlib.Path('/work/main'); name = sys.argv[1]
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
g = tree / 'kernels_src/moe/fp8.py'; s = g.read_text()
if name in ('MG', 'MGD'):
    a = s.index('    qg = q_e + n.to(tl.int64)[:, None] * stride_qn + rk[None, :]')
    b = s.index('    if not NATIVE:\n        acc_g = acc_g * 256.0')
    s = s[:a] + '''    r = tl.arange(0, 128)
    qg = q_e + n.to(tl.int64)[:, None] * stride_qn + r[None, :]
    qu = q_e + (n + N).to(tl.int64)[:, None] * stride_qn + r[None, :]
    s_e = ws_ptr + e * stride_se
    sg = s_e + ((pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    su = s_e + ((N + pid_n * BLOCK_N) // 128).to(tl.int64) * stride_sn
    x_row = x_ptr + t * stride_x
    z = n[:, None] * 0
    k_end = tl.where(ok, K, 0)  # an invalid id runs no iteration and reads no weight, scale or x
    acc_g = tl.zeros((BLOCK_N, 128), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_N, 128), dtype=tl.float32)
    for k0 in range(0, k_end, BLOCK_K):
        for gi in tl.static_range(BLOCK_K // 128):
            kg0 = k0 + gi * 128
            k = kg0 + r
            k_ok = k < K
            wm = n_ok[:, None] & k_ok[None, :]
            wg = tl.load(qg + kg0, mask=wm, other=0)
            wu = tl.load(qu + kg0, mask=wm, other=0)
            xk = tl.load(x_row + (k[None, :] + z), mask=k_ok[None, :], other=0.0).to(tl.float32)
            s_g = tl.load(sg + kg0 // 128, mask=kg0 < K, other=0.0)
            s_u = tl.load(su + kg0 // 128, mask=kg0 < K, other=0.0)
            acc_g += _e4m3_f32(wg, NATIVE) * (xk * s_g)
            acc_u += _e4m3_f32(wu, NATIVE) * (xk * s_u)
    acc_g = tl.sum(acc_g, axis=1)
    acc_u = tl.sum(acc_u, axis=1)
''' + s[b:]
if name == 'MGD':  # MG + the down kernel: h loaded in the [S, BN, BK] product's layout, the slot's scale as [S, BN]
    old = s[s.index('    hk = tl.load(h_rows + k0, mask=hm'):s.index('    return part, w_next')]
    s = s.replace(old, '''    hk = tl.load(h_rows[:, None, :] + k0 + z3, mask=hm[:, None, :], other=0.0).to(tl.float32)
    sc = tl.load(s_rows[:, None] + (k0 // 128 + zn)[None, :], mask=ok[:, None] & (k0 < K), other=0.0)
    part += tl.sum(_e4m3_f32(w, NATIVE) * hk, axis=2) * sc
''')
    s = s.replace('def _down_step(part, w, w_rows, s_rows, h_rows, ok, wm, rk, k0, K, BLOCK_K: tl.constexpr, NATIVE: tl.constexpr):',
                  'def _down_step(part, w, w_rows, s_rows, h_rows, ok, wm, rk, k0, K, z3, zn, BLOCK_K: tl.constexpr,\n'
                  '               NATIVE: tl.constexpr):\n    tl.static_assert(128 % BLOCK_K == 0, "one scale block a step")')
    s = s.replace('k0, K, BLOCK_K, NATIVE)', 'k0, K, z3, zn, BLOCK_K, NATIVE)')
    s = s.replace('''    part = tl.zeros((SB, BLOCK_N), dtype=tl.float32)
''', '''    part = tl.zeros((SB, BLOCK_N), dtype=tl.float32)
    zn = n * 0
    z3 = zn[None, :, None]
''')
g.write_text(s)
subprocess.run(['/work/main/.venv/bin/python', '-c', 'import sys, pathlib; from vkc import regen; regen.regen(pathlib.Path(sys.argv[1]), ["sm_90a"])', str(tree)],
               cwd=tree, env=dict(os.environ, VKC_CUTE_PYTHON='/work/main/.venv-cute/bin/python'), check=True, capture_output=True)
out = tree.parent / 'root'; (out / 'vendored/sm_90a/moe').mkdir(parents=True); (out / 'manifests').mkdir()
for f in (tree / 'vendored/sm_90a/moe').glob('decode.*.cubin' if name == 'MB' else 'w8a16.decode.*.cubin'):
    shutil.copy2(f, out / 'vendored/sm_90a/moe' / f.name)
shutil.copy2(tree / 'manifests/sm_90a.json', out / 'manifests/sm_90a.json')
m = json.loads((out / 'manifests/sm_90a.json').read_text())
print(name, {k: m['kernels'][k]['resources']['registers'] for k in m['kernels'] if ('moe.decode' if name == 'MB' else 'w8a16.decode') in k})
