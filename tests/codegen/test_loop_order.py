"""The order of a map kernel's inner loops (`codegen/loop_order.py`): a transposed read
becomes the innermost loop where more full-size buffers run along it; what a kernel
computes is the same in any order."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.codegen.fusion import FusedKernel, plan
from tracegrad.codegen.loop_order import inner_order

_NHWC_AS_NCHW = """\
graph g(%m: f32[2,5,4,3], %b: f32[3,1,1]) {
  %0: f32[2,3,5,4] = permute(%m, perm=[0,3,1,2])
  %1: f32[2,3,5,4] = expand(%b, shape=[2,3,5,4])
  %2: f32[2,3,5,4] = add(%0, %1)
  return (%2)
}"""

_PLAIN = """\
graph g(%m: f32[2,5,4,3], %b: f32[2,5,4,3]) {
  %0: f32[2,5,4,3] = add(%m, %b)
  %1: f32[2,5,4,3] = mul(%0, %m)
  return (%1)
}"""

_TWO_OUTPUTS_IN_ORDER = """\
graph g(%m: f32[2,5,4,3], %b: f32[2,3,5,4]) {
  %0: f32[2,3,5,4] = permute(%m, perm=[0,3,1,2])
  %1: f32[2,3,5,4] = add(%0, %b)
  %2: f32[2,3,5,4] = mul(%1, %b)
  return (%1, %2)
}"""

_FOLDED_SUM = """\
graph g(%m: f32[2,5,4,3]) {
  %0: f32[2,3,5,4] = permute(%m, perm=[0,3,1,2])
  %1: f32[2,3,5,4] = mul(%0, %0)
  %2: f32[1,1,1,4] = sum(%1, axes=[0,1,2], keepdim=true)
  return (%1, %2)
}"""


def _kernel(text: str) -> FusedKernel:
    kernels = [step for step in plan(tg.ir.parse(text)) if isinstance(step, FusedKernel)]
    assert len(kernels) == 1
    return kernels[0]


@pytest.mark.parametrize("text, order", [
    (_NHWC_AS_NCHW, [2, 3, 1]),  # the channels, contiguous in the read, innermost
    (_PLAIN, [1, 2, 3]),
    (_TWO_OUTPUTS_IN_ORDER, [1, 2, 3]),  # two outputs and a leaf in C order outvote one transposed read
])
def test_the_innermost_loop_is_the_axis_most_full_size_buffers_run_along(text, order):
    assert inner_order(_kernel(text)) == order


def test_a_kernel_folding_a_reduction_keeps_c_order():
    kernel = _kernel(_FOLDED_SUM)
    assert kernel.folded
    assert inner_order(kernel) == [1, 2, 3]


def test_a_reordered_kernel_computes_what_the_interpreter_computes():
    rng = np.random.default_rng(0)
    m = tg.from_numpy(rng.standard_normal((64, 13, 11, 32)).astype(np.float32))
    b = tg.from_numpy(rng.standard_normal((32, 1, 1)).astype(np.float32))

    def nhwc_to_nchw(m, b):
        return (m.permute(0, 3, 1, 2) + b).relu()

    compiled = tg.compile(nhwc_to_nchw)
    for _ in range(2):
        np.testing.assert_array_equal(compiled(m, b).numpy(), nhwc_to_nchw(m, b).numpy())
