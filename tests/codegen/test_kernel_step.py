"""KernelStep's call path: the data addresses it hands a kernel."""

import numpy as np

import tracegrad as tg
from tracegrad.codegen import kernels


def test_a_kernel_reads_the_data_address_of_every_kind_of_array():
    base = np.arange(24.0).reshape(4, 6)
    arrays = [np.empty(5, np.float32), np.array(1.5), np.array(True), np.zeros(0),
              base[1:], base[:, 2:].copy(), np.broadcast_to(np.arange(3.0), (2, 3)),
              np.frombuffer(bytes(16), dtype=np.int64)]  # read-only, not owning its data
    for array in arrays:
        assert kernels.data_address(array) == array.ctypes.data


def test_python_scalars_reach_a_kernel_with_new_values_on_every_call():
    compiled = tg.compile(lambda x, a, b: (x * a + b).exp())
    x = tg.arange(16.0)
    for a, b in [(0.5, 1.0), (-0.25, 2.0), (0.125, -3.0)]:
        np.testing.assert_allclose(compiled(x, a, b).numpy(), np.exp(np.arange(16.0) * a + b), rtol=1e-6)
    assert compiled.cache_info().misses == 1
