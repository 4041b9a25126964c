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


def test_a_kernels_0d_leaf_may_come_as_a_numpy_scalar_and_a_shaped_one_strided():
    compiled = tg.compile(lambda x, s: x * s + 1.0)
    x = tg.from_numpy(np.arange(12.0).reshape(3, 4))
    s = tg.tensor(2.0, dtype=tg.float64)
    compiled(x, s)
    (program,) = compiled._programs.values()
    (step,) = program.steps
    assert step.scalar_leaves and step.shaped_leaves
    leaves = [None] * len(step.inputs)
    strided = np.arange(24.0).reshape(3, 8)[:, ::2]  # not contiguous: copied for the kernel
    for i in step.shaped_leaves:
        leaves[i] = strided
    for i in step.scalar_leaves:  # (s and the 1.0)
        leaves[i] = np.float64(2.0)  # a NumPy scalar, not an array
    (result,) = step.compute(leaves)
    np.testing.assert_array_equal(result, strided * 2.0 + 2.0)
