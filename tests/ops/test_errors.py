"""Errors for bad input: the right exception type, a message naming the op and the
offending shapes/dtypes, and no state changed (data, version, graph, RNG) when raised."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.ops import reduction

def _write_out_of_bounds():
    x = tg.zeros(3, 2)
    x[tg.tensor([5])] = 1.0
    return x


# name -> (call, exception type, message pattern)
ERRORS = {
    "add_broadcast": (lambda: tg.ones(2, 3) + tg.ones(4), RuntimeError,
                      r"add: shapes \[2, 3\], \[4\] cannot be broadcast"),
    "mul_broadcast": (lambda: tg.ones(2, 3) * tg.ones(2, 2), RuntimeError,
                      r"mul: shapes \[2, 3\], \[2, 2\] cannot be broadcast"),
    "where_broadcast": (lambda: tg.where(tg.ones(3) > 0, tg.ones(3), tg.ones(2)), RuntimeError,
                        r"where: shapes \[3\], \[3\], \[2\] cannot be broadcast"),
    "add_string": (lambda: tg.ones(2) + "a", TypeError, "add: expected a Tensor or a Python number, got str"),
    "exp_of_list": (lambda: tg.exp([1.0]), TypeError, r"exp\(\): argument 'input' must be Tensor, not list"),
    "matmul_inner_mismatch": (lambda: tg.ones(2, 3) @ tg.ones(4, 5), RuntimeError,
                              r"matmul: mat1 and mat2 shapes cannot be multiplied \(\[2, 3\] and \[4, 5\]\)"),
    "matmul_batch_mismatch": (lambda: tg.ones(2, 2, 3) @ tg.ones(3, 3, 2), RuntimeError,
                              r"matmul: the batch dimensions of \[2, 2, 3\] and \[3, 3, 2\] cannot be broadcast"),
    "matmul_0d": (lambda: tg.tensor(1.0) @ tg.ones(2), RuntimeError,
                  "matmul: both arguments to matmul need to be at least 1D, but they are 0D and 1D"),
    "reshape_size": (lambda: tg.ones(2, 3).reshape(4, 2), RuntimeError,
                     r"reshape: shape \[4, 2\] is invalid for input of size 6"),
    "reshape_two_inferred": (lambda: tg.ones(2, 3).reshape(-1, -1), RuntimeError,
                             "reshape: only one dimension can be inferred"),
    "view_infer_size": (lambda: tg.ones(2, 3).view(-1, 4), RuntimeError,
                        r"reshape: shape \[-1, 4\] is invalid for input of size 6"),
    "permute_length": (lambda: tg.ones(2, 3).permute(1, 0, 2), IndexError, "permute: Dimension out of range"),
    "permute_repeated": (lambda: tg.ones(2, 3).permute(0, 0), RuntimeError,
                         r"permute: \[0, 0\] is not a permutation of the 2 dims of a tensor of shape \[2, 3\]"),
    "expand_mismatch": (lambda: tg.ones(2, 3).expand(4, 3), RuntimeError,
                        r"expand: shapes \[2, 3\], \[4, 3\] cannot be broadcast"),
    "expand_fewer_dims": (lambda: tg.ones(2, 3).expand(3), RuntimeError,
                          r"expand: the number of sizes provided \(1\) must be greater or equal"),
    "sum_dim_range": (lambda: tg.ones(2, 3).sum(2), IndexError,
                      r"sum: Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"),
    "mean_dim_range": (lambda: tg.ones(2, 3).mean(-3), IndexError, "mean: Dimension out of range"),
    "max_dim_range": (lambda: tg.ones(2, 3).max(5), IndexError, "max: Dimension out of range"),
    "softmax_dim_range": (lambda: tg.softmax(tg.ones(2, 3), 2), IndexError, "softmax: Dimension out of range"),
    "transpose_dim_range": (lambda: tg.ones(2, 3).transpose(0, 2), IndexError,
                            "transpose: Dimension out of range"),
    "unsqueeze_dim_range": (lambda: tg.ones(2, 3).unsqueeze(4), IndexError, "unsqueeze: Dimension out of range"),
    "t_of_3d": (lambda: tg.ones(2, 3, 4).t(), RuntimeError,
                r"t\(\) expects a tensor with <= 2 dimensions, but self is 3D"),
    "cat_sizes": (lambda: tg.cat([tg.ones(2, 3), tg.ones(2, 4)]), RuntimeError,
                  r"cat: sizes of tensors must match except in dimension 0: got f32\[2,3\] and f32\[2,4\]"),
    "cat_ndim": (lambda: tg.cat([tg.ones(2, 3), tg.ones(3)]), RuntimeError,
                 r"cat\(\): tensors must have the same number of dimensions: got 2 and 1"),
    "cat_empty": (lambda: tg.cat([]), RuntimeError, r"cat\(\): expected a non-empty list of Tensors"),
    "cat_0d": (lambda: tg.cat([tg.tensor(1.0), tg.tensor(2.0)]), RuntimeError,
               r"cat: zero-dimensional tensor \(at position 0\) cannot be concatenated"),
    "sum_axis_of_0d": (lambda: reduction.sum_(tg.tensor(1.0), (0,)), IndexError,
                       r"sum: axis 0 out of range for a tensor of shape \[\]"),
    "amax_of_empty_axis": (lambda: tg.zeros(0, 3).amax(0), RuntimeError,
                           r"amax: cannot reduce over an empty axis of a tensor of shape \[0, 3\]"),
    "stack_shapes": (lambda: tg.stack([tg.ones(2), tg.ones(3)]), RuntimeError,
                     r"stack expects each tensor to be equal size, but got \[2\] at entry 0 and \[3\] at entry 1"),
    "gather_index_dtype": (lambda: tg.ones(2, 3).gather(1, tg.ones(2, 1)), TypeError,
                           r"gather: index must be an int64 tensor, got float32 \[2, 1\]"),
    "gather_index_bounds": (lambda: tg.ones(2, 3).gather(1, tg.tensor([[5], [0]])), IndexError,
                            "gather: index 5 is out of bounds for dimension 1 with size 3"),
    "gather_negative_index": (lambda: tg.ones(2, 3).gather(1, tg.tensor([[-1], [0]])), IndexError,
                              r"gather: index -1 is out of bounds for dimension 1 with size 3"),
    "gather_ndim": (lambda: tg.ones(2, 3).gather(1, tg.tensor([0])), RuntimeError,
                    r"gather: index \[1\] and input \[2, 3\] must have the same number of dimensions"),
    "getitem_int_bounds": (lambda: tg.ones(3, 2)[3], IndexError,
                           "index 3 is out of bounds for dimension 0 with size 3"),
    "getitem_array_bounds": (lambda: tg.ones(3, 2)[[0, 7]], IndexError,
                             "index: index 7 is out of bounds for dimension 0 with size 3"),
    "setitem_array_bounds": (_write_out_of_bounds, IndexError,
                             "index: index 5 is out of bounds for dimension 0 with size 3"),
    "embedding_negative_index": (lambda: tg.nn.functional.embedding(tg.tensor([-1]), tg.ones(3, 2)), IndexError,
                                 "index: index -1 is out of bounds for dimension 0 with size 3"),
    "getitem_too_many": (lambda: tg.ones(3, 2)[0, 0, 0], IndexError, "too many indices for tensor of dimension 2"),
    "getitem_two_ellipses": (lambda: tg.ones(3, 2)[..., ...], IndexError, "an index can only have a single ellipsis"),
    "getitem_float": (lambda: tg.ones(3, 2)[1.5], IndexError, "index: unsupported index of type float"),
    "getitem_float_array": (lambda: tg.ones(3, 2)[np.array([0.5])], IndexError,
                            "index: tensors used as indices must be long, int or bool tensors"),
    "getitem_negative_step": (lambda: tg.ones(3, 2)[::-1], ValueError, "step must be greater than zero"),
    "getitem_mask_shape": (lambda: tg.ones(3, 2)[np.array([True, False])], IndexError,
                           r"The shape of the mask \[2\] at index 0 does not match the shape of the indexed "
                           r"tensor \[3, 2\] at index 0"),
    "layer_norm_shape": (lambda: tg.layer_norm(tg.ones(2, 3), (4,)), RuntimeError,
                         r"layer_norm: Given normalized_shape=\[4\], expected input with shape \[\*, 4\], but got "
                         r"input of size \[2, 3\]"),
    "linear_shape": (lambda: tg.linear(tg.ones(2, 3), tg.ones(4, 5)), RuntimeError,
                     r"linear: mat1 and mat2 shapes cannot be multiplied \(\[2, 3\] and weight \[4, 5\]\)"),
    "cross_entropy_float_target": (lambda: tg.cross_entropy(tg.ones(2, 3), tg.ones(2)), TypeError,
                                   r"cross_entropy: expected target of class indices \(int64\), got float32"),
    "cross_entropy_batch": (lambda: tg.cross_entropy(tg.ones(2, 3), tg.tensor([0, 1, 2])), ValueError,
                            r"cross_entropy: Expected input batch_size \(2\) to match target batch_size \(3\)"),
    "cross_entropy_3d": (lambda: tg.cross_entropy(tg.ones(2, 3, 4), tg.tensor([0, 1])), RuntimeError,
                         r"cross_entropy: expected input of shape \(N, C\) or \(C,\), got \[2, 3, 4\]"),
    "cross_entropy_class_bounds": (lambda: tg.cross_entropy(tg.ones(2, 3), tg.tensor([0, 3])), IndexError,
                                   "cross_entropy: Target 3 is out of bounds."),
    "cross_entropy_negative_target": (lambda: tg.cross_entropy(tg.ones(2, 3), tg.tensor([0, -3])), IndexError,
                                      "cross_entropy: Target -3 is out of bounds."),
    "mse_loss_reduction": (lambda: tg.mse_loss(tg.ones(2), tg.ones(2), reduction="avg"), ValueError,
                           "mse_loss: avg is not a valid value for reduction"),
    "where_condition_dtype": (lambda: tg.where(tg.ones(2), tg.ones(2), tg.ones(2)), TypeError,
                              "where: expected condition to be a bool tensor, got float32"),
    "requires_grad_on_int": (lambda: tg.tensor([1, 2]).requires_grad_(), RuntimeError,
                             r"only Tensors of floating point and complex dtype can require gradients \(got int64\)"),
    "item_of_many": (lambda: tg.ones(2).item(), RuntimeError,
                     "a Tensor with 2 elements cannot be converted to Scalar"),
    "bool_of_many": (lambda: bool(tg.ones(2)), RuntimeError,
                     "Boolean value of Tensor with more than one value is ambiguous"),
}


@pytest.mark.parametrize("name", ERRORS)
def test_bad_input_raises_a_message_naming_the_op_and_operands(name):
    call, error, pattern = ERRORS[name]
    with pytest.raises(error, match=pattern):
        call()


@pytest.mark.parametrize("name", ERRORS)
def test_bad_input_raises_the_eager_error_when_compiled(name):
    call, error, pattern = ERRORS[name]
    compiled = tg.compile(call)
    for _ in range(2):  # traced, then following the recorded trace
        with pytest.raises(error, match=pattern):
            compiled()


# --- nothing changes when an op raises ------------------------------------------------------


def test_failed_inplace_op_leaves_data_and_version_unchanged():
    x = tg.zeros(2, 3)
    with pytest.raises(RuntimeError, match=r"add: shapes \[2, 3\], \[4\] cannot be broadcast"):
        x.add_(tg.ones(4))
    assert x._version == 0
    np.testing.assert_array_equal(x.numpy(), np.zeros((2, 3)))


def test_inplace_op_whose_result_would_grow_the_tensor_raises_and_keeps_it():
    x = tg.zeros(3)
    with pytest.raises(RuntimeError, match=r"add_: output with shape \[3\] doesn't match the broadcast shape \[2, 3\]"):
        x.add_(tg.ones(2, 3))
    assert x._version == 0
    np.testing.assert_array_equal(x.numpy(), np.zeros(3))


def test_inplace_float_result_into_int_tensor_raises_and_keeps_it():
    x = tg.tensor([1, 2])
    with pytest.raises(RuntimeError, match="div_: result type float32 can't be cast to the desired output type int64"):
        x.div_(2)
    assert x._version == 0
    np.testing.assert_array_equal(x.numpy(), [1, 2])


def test_failed_setitem_leaves_the_tensor_unchanged():
    x = tg.zeros(3, 2)
    with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"):
        x[5] = 1.0
    assert x._version == 0
    np.testing.assert_array_equal(x.numpy(), np.zeros((3, 2)))


def test_failed_op_on_a_leaf_records_nothing():
    x = tg.ones(2, 3, requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot be broadcast"):
        x * tg.ones(4)
    assert x.is_leaf and x.grad_fn is None and x.grad is None


def test_failed_dropout_does_not_consume_random_numbers():
    tg.manual_seed(1)
    expected = tg.rand(3).numpy()
    tg.manual_seed(1)
    with pytest.raises(ValueError, match="dropout probability"):
        tg.dropout(tg.ones(3), 2.0)
    np.testing.assert_array_equal(tg.rand(3).numpy(), expected)
