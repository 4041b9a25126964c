"""KernelStep's call path: the arrays it hands a kernel."""

import numpy as np

import tracegrad as tg


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
