"""Where a fresh vkc process spends its time before the first correct result (printed as JSON)."""
import time

T0 = time.perf_counter()
marks = {}


def mark(name):
    marks[name] = round((time.perf_counter() - T0) * 1e3, 2)


import numpy as np  # noqa: E402
mark("import numpy")
from cuda.bindings import driver as cu  # noqa: E402
mark("import cuda.bindings.driver")
cu.cuInit(0)
mark("cuInit")
import vkc_runtime as vr  # noqa: E402
mark("import vkc_runtime (+import check)")
from vkc_runtime import driver  # noqa: E402
driver.ensure_context()
mark("ensure_context")
n = 1 << 20
x = np.random.rand(n).astype(np.float32)
y = np.random.rand(n).astype(np.float32)
dx, dy = vr.DeviceArray.from_numpy(x), vr.DeviceArray.from_numpy(y)
out = vr.DeviceArray.empty((n,), "float32")
mark("allocate + copy inputs")
k = vr.get_kernel("selftest.scale_add.b1024")
k.load()
mark("get_kernel + load (sha256, cuModuleLoadData)")
k.launch(((n + 1023) // 1024, 1, 1), (dx.ptr, dy.ptr, out.ptr, n, 0.5), 0)
got = out.to_numpy()
mark("launch + copy back")
assert np.allclose(got, x + np.float32(0.5) * y)
import json  # noqa: E402
print(json.dumps(marks))
