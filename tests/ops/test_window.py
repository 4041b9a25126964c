"""`ops/window.py`: im2col and col2im. Values against loops written out in NumPy, each the
other's transpose, gradients of first and second order (float64, eager and compiled),
compiled equal to eager with col2im lowered into a kernel, and the shape rules' errors."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.ops import window

CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]

# name -> (image shape (B, H, W, C), kernel, stride, dilation)
GEOMETRIES = {
    "3x3": ((2, 5, 6, 3), (3, 3), (1, 1), (1, 1)),
    "strided": ((2, 7, 6, 2), (3, 2), (2, 3), (1, 1)),
    "dilated": ((1, 7, 8, 2), (2, 3), (1, 2), (3, 2)),
    "many_channels": ((1, 4, 5, 9), (2, 2), (1, 1), (1, 1)),
    "kernel_fills_image": ((3, 2, 3, 1), (2, 3), (1, 1), (1, 1)),
    "size_1_dims": ((1, 1, 4, 1), (1, 2), (1, 2), (1, 1)),
    "gaps_between_windows": ((1, 9, 9, 2), (2, 2), (4, 3), (1, 1)),
}


def _windows_loop(x, kernel, stride, dilation):
    batch, height, width, channels = x.shape
    out_h = (height - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    out = np.zeros((batch, out_h, out_w, *kernel, channels), x.dtype)
    for oh in range(out_h):
        for ow in range(out_w):
            for i in range(kernel[0]):
                for j in range(kernel[1]):
                    out[:, oh, ow, i, j] = x[:, oh * stride[0] + i * dilation[0], ow * stride[1] + j * dilation[1]]
    return out


def _image_loop(columns, size, kernel, stride, dilation):
    batch, out_h, out_w, _, _, channels = columns.shape
    out = np.zeros((batch, *size, channels), columns.dtype)
    for oh in range(out_h):
        for ow in range(out_w):
            for i in range(kernel[0]):
                for j in range(kernel[1]):
                    row, column = oh * stride[0] + i * dilation[0], ow * stride[1] + j * dilation[1]
                    out[:, row, column] += columns[:, oh, ow, i, j]
    return out


def _leaf(shape, seed=0):
    return tg.from_numpy(np.random.default_rng(seed).standard_normal(shape)).requires_grad_()


def _column_shape(name):
    shape, kernel, stride, dilation = GEOMETRIES[name]
    return _windows_loop(np.zeros(shape), kernel, stride, dilation).shape


@pytest.mark.parametrize("name", GEOMETRIES)
def test_im2col_gives_each_windows_pixels_in_kernel_order(name):
    shape, kernel, stride, dilation = GEOMETRIES[name]
    x = np.random.default_rng(1).standard_normal(shape)
    out = window.im2col(tg.from_numpy(x), kernel, stride, dilation)
    np.testing.assert_array_equal(out.numpy(), _windows_loop(x, kernel, stride, dilation))


@pytest.mark.parametrize("name", GEOMETRIES)
def test_col2im_adds_each_window_entry_into_its_pixel(name):
    shape, kernel, stride, dilation = GEOMETRIES[name]
    columns = np.random.default_rng(2).standard_normal(_column_shape(name))
    out = window.col2im(tg.from_numpy(columns), shape[1:3], kernel, stride, dilation)
    np.testing.assert_allclose(out.numpy(), _image_loop(columns, shape[1:3], kernel, stride, dilation), rtol=1e-14)


def test_im2col_reads_a_non_contiguous_image_as_its_values():
    x = np.random.default_rng(3).standard_normal((2, 3, 6, 5))  # (B, C, H, W)
    view = tg.from_numpy(x).permute(0, 2, 3, 1)
    assert not view.is_contiguous()
    out = window.im2col(view, (2, 2), (1, 1), (1, 1))
    np.testing.assert_array_equal(out.numpy(), _windows_loop(x.transpose(0, 2, 3, 1), (2, 2), (1, 1), (1, 1)))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", GEOMETRIES)
def test_im2col_gradients(name, check):
    shape, kernel, stride, dilation = GEOMETRIES[name]
    assert check(lambda x: window.im2col(x, kernel, stride, dilation), (_leaf(shape),))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", GEOMETRIES)
def test_col2im_gradients(name, check):
    shape, kernel, stride, dilation = GEOMETRIES[name]
    assert check(lambda c: window.col2im(c, shape[1:3], kernel, stride, dilation), (_leaf(_column_shape(name)),))


def _step(name):
    shape, kernel, stride, dilation = GEOMETRIES[name]

    def step(x, columns):
        # im2col of a computed, permuted image, col2im into an activation's gradient: the
        # reads compiled code fuses.
        image = window.im2col(x.tanh().permute(0, 2, 1, 3), kernel, stride, dilation)
        summed = window.col2im(columns * 2, shape[1:3], kernel, stride, dilation)
        loss = (image * image).sum() + (summed * summed.sin()).sum()
        return (image, summed), tg.autograd.grad(loss, [x, columns], create_graph=True)
    return step


def _transposed_shapes(name):
    shape, kernel, stride, dilation = GEOMETRIES[name]
    permuted = (shape[0], shape[2], shape[1], shape[3])
    return permuted, _windows_loop(np.zeros(shape), kernel, stride, dilation).shape


@pytest.mark.parametrize("name", GEOMETRIES)
def test_compiled_equals_eager(name):
    x_shape, column_shape = _transposed_shapes(name)
    step = _step(name)
    compiled = tg.compile(step)
    for seed in range(2):
        args = (_leaf(x_shape, seed), _leaf(column_shape, seed + 5))
        (values, grads), (want_values, want_grads) = compiled(*args), step(*args)
        for got, want in zip(values + grads, want_values + want_grads):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)


def _compiled_steps(fn, *args) -> list[tuple[str, str]]:
    compiled = tg.compile(fn)
    compiled(*args)
    program = next(iter(compiled._programs.values()))
    return program._describe()[1]


def test_compiled_col2im_runs_in_a_kernel_fused_with_what_reads_it():
    columns = tg.from_numpy(np.random.default_rng(4).standard_normal((2, 5, 4, 3, 3, 4)).astype(np.float32))
    steps = _compiled_steps(lambda c: window.col2im(c, (11, 9), (3, 3), (2, 2), (1, 1)).relu() * 3, columns)
    assert [kind for kind, _ in steps] == ["llvm"] and "col2im" in steps[0][1]


def test_col2im_over_more_offsets_than_it_unrolls_runs_as_numpy_compiled_and_equals_eager():
    kernel = (9, 8)
    assert kernel[0] * kernel[1] > window.MAX_UNROLLED_OFFSETS
    columns = tg.from_numpy(np.random.default_rng(5).standard_normal((1, 2, 3, *kernel, 2)))

    def fn(c):
        return window.col2im(c, (10, 10), kernel, (1, 1), (1, 1))
    assert ("numpy", "col2im") in _compiled_steps(fn, columns)
    np.testing.assert_allclose(tg.compile(fn)(columns).numpy(), fn(columns).numpy(), rtol=1e-14)


def test_an_empty_batch_gives_empty_windows_and_images_eager_and_compiled():
    def fn(x):
        columns = window.im2col(x, (2, 2), (1, 1), (1, 1))
        return columns, window.col2im(columns, (3, 3), (2, 2), (1, 1), (1, 1))
    x = tg.zeros(0, 3, 3, 2)
    for columns, image in (fn(x), tg.compile(fn)(x)):
        assert columns.shape == (0, 2, 2, 2, 2, 2) and image.shape == (0, 3, 3, 2)


@pytest.mark.parametrize("call, message", [
    (lambda: window.im2col(tg.zeros(2, 3, 3), (2, 2), (1, 1), (1, 1)), r"im2col: expected a 4-D .* got \[2, 3, 3\]"),
    (lambda: window.im2col(tg.zeros(1, 3, 3, 1), (4, 2), (1, 1), (1, 1)), r"im2col: kernel \[4, 2\] .* 3x3"),
    (lambda: window.im2col(tg.zeros(1, 3, 3, 1), (2, 2), (0, 1), (1, 1)), r"im2col: stride must be two positive"),
    (lambda: window.col2im(tg.zeros(1, 2, 2, 2, 2, 1), (4, 3), (2, 2), (1, 1), (1, 1)),
     r"col2im: windows \[1, 2, 2, 2, 2, 1\] do not match an image of 4x3 .* \(expected 3x2 windows\)"),
    (lambda: window.col2im(tg.zeros(1, 2, 2, 1), (3, 3), (2, 2), (1, 1), (1, 1)), r"col2im: expected 6-D"),
])
def test_bad_geometry_is_an_error_naming_the_op_and_shapes(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", ["strided", "dilated", "gaps_between_windows"])
def test_compiled_gradients(name, check):
    shape, kernel, stride, dilation = GEOMETRIES[name]
    assert check(tg.compile(lambda x: window.im2col(x, kernel, stride, dilation)), (_leaf(shape),))
    assert check(tg.compile(lambda c: window.col2im(c, shape[1:3], kernel, stride, dilation)),
                 (_leaf(_column_shape(name)),))
