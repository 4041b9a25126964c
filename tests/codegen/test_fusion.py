"""Fusion plans: which values kernels write, and in which layout.

A view read by a NumPy step (a transposed matmul operand) is a NumPy view of its source,
and the kernel writes the source in its own layout; a view NumPy would copy is written by
the kernel in its own layout instead.
"""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.codegen.fusion import FusedKernel, plan
from tracegrad.runtime.program import NumpyStep

_RNG = np.random.default_rng(0)


def _tensor(*shape):
    return tg.from_numpy(_RNG.standard_normal(shape))


def _program(compiled):
    (program,) = compiled._programs.values()
    return program


def _kernel_result_shapes(program) -> list[tuple[int, ...]]:
    return [shape for step in program.steps if not isinstance(step, NumpyStep)
            for shape, _ in step.out_specs]


def _numpy_labels(program) -> list[str]:
    return [step.label for step in program.steps if isinstance(step, NumpyStep)]


def _check_equal_to_eager(fn, *inputs):
    compiled = tg.compile(fn)
    expected = fn(*inputs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for _ in range(2):  # the second run reuses buffers from the pool
        results = compiled(*inputs)
        results = results if isinstance(results, tuple) else (results,)
        for result, eager in zip(results, expected):
            np.testing.assert_allclose(result.numpy(), eager.numpy(), rtol=1e-12, atol=1e-12)
    return _program(compiled)


def _relu_backward(h, g):
    return tg.where(h > 0, g, tg.zeros_like(g))


def _weight_gradient(h, g, x):
    return _relu_backward(h, g).T @ x


def test_kernel_result_read_transposed_by_matmul_is_written_in_its_own_layout():
    program = _check_equal_to_eager(_weight_gradient, _tensor(16, 8), _tensor(16, 8), _tensor(16, 3))
    assert _kernel_result_shapes(program) == [(16, 8)]
    assert "permute+matmul" in _numpy_labels(program)  # (the product takes the view of the kernel's result)
    assert all("permute" not in step.label for step in program.steps if not isinstance(step, NumpyStep))


def _first_layer_backward(h, g, x):
    dy = _relu_backward(h, g)
    return dy.T @ x, dy.sum(0)


def test_value_read_transposed_by_matmul_and_by_reduction_is_computed_in_one_loop():
    program = _check_equal_to_eager(_first_layer_backward, _tensor(16, 8), _tensor(16, 8), _tensor(16, 3))
    assert program.kernel_count == 1
    assert _kernel_result_shapes(program) == [(16, 8), (8,)]


def _linear_backward(h, g, x, w):
    dy = _relu_backward(h, g)
    return dy.T @ x, dy @ w, dy.sum(0)


def test_value_read_plain_and_transposed_by_matmuls_is_written_once():
    program = _check_equal_to_eager(_linear_backward, _tensor(16, 8), _tensor(16, 8), _tensor(16, 3),
                                    _tensor(8, 5))
    # dY and its column sums come out of one loop; the transposed operand is a view
    assert _kernel_result_shapes(program) == [(16, 8), (8,)]


def _batched_weight_gradient(h, g, x):
    dy = _relu_backward(h, g).reshape(16, 4)
    return dy.T @ x


def test_chain_of_views_read_by_matmul_is_taken_from_the_source_buffer():
    program = _check_equal_to_eager(_batched_weight_gradient, _tensor(2, 8, 4), _tensor(2, 8, 4), _tensor(16, 3))
    assert _kernel_result_shapes(program) == [(2, 8, 4)]
    assert _numpy_labels(program) == ["reshape+permute+matmul"]  # (the product takes the chain of views itself)



def _channels_last_rows(h, g, w):
    # A convolution's backward: a channels-first gradient, whose channels-last rows are a
    # product's operand (a reshape NumPy cannot take as a view).
    return _relu_backward(h, g).permute(0, 2, 3, 1).reshape(24, 4) @ w


def test_a_view_numpy_would_copy_for_a_matmul_is_written_by_the_kernel_in_its_layout():
    program = _check_equal_to_eager(_channels_last_rows, _tensor(2, 4, 3, 4), _tensor(2, 4, 3, 4), _tensor(4, 5))
    assert _kernel_result_shapes(program) == [(24, 4)]
    assert _numpy_labels(program) == ["matmul"]


def _channels_last_rows_and_channel_sums(h, g, w):
    dy = _relu_backward(h, g)
    return dy.permute(0, 2, 3, 1).reshape(24, 4) @ w, dy.sum((0, 2, 3))


def test_a_copied_view_whose_source_is_read_elsewhere_is_a_copy_kernel_of_the_sources_buffer():
    program = _check_equal_to_eager(_channels_last_rows_and_channel_sums, _tensor(2, 4, 3, 4), _tensor(2, 4, 3, 4),
                                    _tensor(4, 5))
    assert (2, 4, 3, 4) in _kernel_result_shapes(program) and (24, 4) in _kernel_result_shapes(program)
    assert "reshape" not in _numpy_labels(program)

def _broadcast_operand(v, w):
    return (v * 2.0).expand(16, 8) @ w


def test_broadcast_read_by_matmul_writes_only_its_source():
    program = _check_equal_to_eager(_broadcast_operand, _tensor(1, 8), _tensor(8, 3))
    assert _kernel_result_shapes(program) == [(1, 8)]


def _sliced_operand(x, w):
    return (x * 2.0)[:4] @ w


def test_slice_read_by_matmul_is_written_without_the_rest_of_its_source():
    program = _check_equal_to_eager(_sliced_operand, _tensor(16, 8), _tensor(8, 3))
    assert _kernel_result_shapes(program) == [(4, 8)]


_TRANSPOSED_OUTPUT = """\
graph g(%x: f32[16,8]) {
  %0: f32[16,8] = mul(%x, %x)
  %1: f32[8,16] = permute(%0, perm=[1,0])
  return (%1)
}"""


def test_transposed_graph_output_is_written_by_the_kernel_in_its_own_layout():
    graph = tg.ir.parse(_TRANSPOSED_OUTPUT)
    (step,) = plan(graph)
    assert isinstance(step, FusedKernel)
    assert step.results == graph.outputs


def _input_gradient_of_a_convolution(pre_activation, columns):
    # A convolution's input gradient: col2im sums the windows' entries channels-last; the
    # program goes on channels-first (the ReLU before the convolution).
    image = tg.ops.window.col2im(columns, (6, 5), (3, 3), (1, 1), (1, 1)).permute(0, 3, 1, 2)
    return _relu_backward(pre_activation, image)


def test_col2im_read_channels_first_is_summed_in_its_own_layout_first():
    program = _check_equal_to_eager(_input_gradient_of_a_convolution, _tensor(2, 4, 6, 5), _tensor(2, 4, 3, 3, 3, 4))
    assert _kernel_result_shapes(program) == [(2, 6, 5, 4), (2, 4, 6, 5)]
    assert "col2im" in program.steps[0].label and "col2im" not in program.steps[1].label


def test_col2im_read_in_its_own_layout_is_summed_where_it_is_read():
    def fn(pre_activation, columns):
        return _relu_backward(pre_activation, tg.ops.window.col2im(columns, (6, 5), (3, 3), (1, 1), (1, 1)))
    program = _check_equal_to_eager(fn, _tensor(2, 6, 5, 4), _tensor(2, 4, 3, 3, 3, 4))
    assert _kernel_result_shapes(program) == [(2, 6, 5, 4)]


def _kernels(program) -> list:
    return [step for step in program.steps if hasattr(step, "kernel")]


def _many_updates(*tensors):
    half = len(tensors) // 2
    return tuple(p - 0.1 * g * g.abs() + 0.01 * p.tanh() for p, g in zip(tensors[:half], tensors[half:]))


def _many_reads_of_one_tensor(x, *tensors):
    return tuple(p - 0.1 * x * p.tanh() + x.abs() for p in tensors)


def test_kernels_sharing_a_buffer_are_merged_into_loops_of_bounded_size():
    # (Merged into one loop, the kernel would grow with the number of outputs, and LLVM's
    # compile time faster than that.)
    from tracegrad.codegen import fusion

    for shape in ((16,), (4, 8)):
        program = _check_equal_to_eager(_many_reads_of_one_tensor, *[_tensor(*shape) for _ in range(41)])
        kernels = _kernels(program)
        assert 1 < len(kernels) < 40
        assert all(step.kernel.size <= fusion.MAX_LOOP_SIZE for step in kernels)


def test_independent_updates_of_small_tensors_are_separate_kernels_compiled_once():
    # (An optimizer's update of many parameters: one kernel per parameter, the same code.)
    for shape in ((16,), (4, 8)):
        tensors = [_tensor(*shape) for _ in range(2 * 12)]
        kernels = _kernels(_check_equal_to_eager(_many_updates, *tensors))
        assert len(kernels) == 12
        assert len({step.symbol for step in kernels}) == 1


def test_independent_kernels_over_a_big_domain_share_one_loop(monkeypatch):
    from tracegrad.codegen import fusion

    monkeypatch.setattr(fusion, "SEPARATE_BELOW", 32)
    for shape in ((32,), (4, 8)):
        tensors = [_tensor(*shape) for _ in range(2 * 3)]
        assert len(_kernels(_check_equal_to_eager(_many_updates, *tensors))) == 1


def _residual_stream(x, *branches):
    for a in branches:
        x = x + x.sum(1, keepdim=True) * a  # x is read by the reduction and by the next block
    return x


def test_residual_stream_read_by_several_kernels_is_computed_once_per_block():
    # Recomputed in each reader, block l's input would be computed again from every
    # earlier block's buffers: work quadratic in the depth (99 nodes here, not 48).
    branches = [_tensor(6, 5) for _ in range(12)]
    program = _check_equal_to_eager(_residual_stream, _tensor(6, 5), *branches)
    computed = sum(len(step.kernel.nodes) for step in _kernels(program))
    assert computed <= 4 * len(branches)


def _max_of_relu(x, bias):
    values = (x + bias).relu().permute(0, 3, 1, 2).max(dim=3).values
    (grad,) = tg.autograd.grad(values.square().sum(), [x])
    return values.detach(), grad


def test_a_max_and_its_argmax_are_computed_in_one_loop():
    # max(dim).values gathers at the argmax: that index needs no bounds check (an argmax
    # over the axis the gather reads), so the gather joins the argmax's loop and takes it
    # from the same iteration instead of a second pass over the reduced input.
    x = _tensor(2, 8, 8, 3).requires_grad_()
    program = _check_equal_to_eager(_max_of_relu, x, _tensor(3))
    first = _kernels(program)[0]
    assert sorted(shape for shape, _ in first.out_specs) == [(2, 3, 8, 1), (2, 3, 8, 1)]
    assert {dtype for _, dtype in first.out_specs} == {np.dtype(np.float64), np.dtype(np.int64)}
    assert not first.index_checks


def test_ties_and_nans_pick_the_first_and_match_eager():
    x = tg.tensor([[[1.0, 3.0, 3.0, 0.0], [float("nan"), 2.0, float("nan"), 5.0], [-0.0, 0.0, 0.0, -0.0]]],
                  requires_grad=True)

    def fn(x):
        values, indices = (x * 1.0).max(dim=2)
        (grad,) = tg.autograd.grad(values.nan_to_num().sum(), [x])
        return values, indices, grad

    compiled = tg.compile(fn)
    for _ in range(2):
        for got, want in zip(compiled(x), fn(x)):
            np.testing.assert_array_equal(got.detach().numpy(), want.detach().numpy())
    np.testing.assert_array_equal(fn(x)[1].numpy(), [[1, 0, 0]])  # (-0.0 ties 0.0: the first)


def test_an_index_from_an_argmax_over_a_longer_axis_is_still_checked():
    # argmax over 6 entries gathered from a row of 4: out of bounds where the max is late.
    def fn(scores, table):
        return table.gather(1, scores.argmax(dim=1, keepdim=True))

    compiled = tg.compile(fn)
    table = _tensor(3, 4)
    in_bounds = tg.tensor([[5.0, 1, 0, 0, 0, 0], [0, 0, 9, 0, 0, 0], [0, 0, 0, 7, 0, 0]])
    np.testing.assert_array_equal(compiled(in_bounds, table).numpy(), fn(in_bounds, table).numpy())
    late = tg.tensor([[0.0, 0, 0, 0, 1, 0], [0, 0, 9, 0, 0, 0], [0, 0, 0, 7, 0, 0]])
    for run in (fn, compiled):
        with pytest.raises(IndexError, match="gather: index 4 is out of bounds for dimension 1 with size 4"):
            run(late, table)


def test_a_convolutions_bias_gradient_is_summed_where_its_rows_gradient_is_written():
    # conv2d adds the bias to the product's channels-last rows: the gradient the weight's
    # product reads (rows) is written by one kernel with the bias gradient's sum folded in,
    # not written channels-first, copied to rows and summed apart (W9: 1.1 ms a step).
    rng = np.random.default_rng(3)
    conv = tg.nn.Conv2d(3, 8, 3).double()
    x = tg.tensor(rng.standard_normal((2, 3, 10, 10)))

    def step(x):
        out = conv(x)
        loss = (out.relu() ** 2).sum()
        return [out.is_contiguous(), *tg.autograd.grad(loss, [conv.weight, conv.bias])]

    compiled = tg.compile(step)
    want = step(x)
    assert want[0]  # (a fresh contiguous tensor, as PyTorch's)
    for _ in range(3):
        got = compiled(x)
        assert got[0]
        for g, w in zip(got[1:], want[1:]):
            np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-12)
    program = list(compiled._programs.values())[-1]
    labels = [step.label for step in program.steps]
    # (One permute+reshape left: the weight's, as a product's operand; no copy of the
    # gradient to rows, and no sum of its own.)
    assert labels.count("permute+reshape") == 1 and "sum" not in labels, labels
    assert any(label.endswith("permute+reshape+sum") for label in labels), labels
