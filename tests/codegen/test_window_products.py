"""Convolution products that read their image in place (`codegen/window_products.py`,
`gemm.Gathered`): the generated GEMM reads a window matrix through offset tables, with the
values of the GEMM on the written-out windows; compiled convolutions take that path where
it qualifies and equal eager execution; everything else keeps the written-out windows."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.codegen import gemm, window_products
from tracegrad.codegen.gemm_ir import tile_shape
from tracegrad.codegen.window_products import WindowProductStep


def _windows(image: np.ndarray, kernel=(3, 3), stride=(1, 1), dilation=(1, 1)) -> gemm.Gathered:
    """The (B*OH*OW, KH*KW*C) window matrix of a channels-last image, gathered."""
    batch, height, width, channels = image.shape
    s_b, s_h, s_w, s_c = (s // image.itemsize for s in image.strides)
    out_h = (height - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    rows = (np.arange(batch)[:, None, None] * s_b + np.arange(out_h)[None, :, None] * stride[0] * s_h
            + np.arange(out_w)[None, None, :] * stride[1] * s_w).ravel()
    columns = (np.arange(kernel[0])[:, None, None] * dilation[0] * s_h
               + np.arange(kernel[1])[None, :, None] * dilation[1] * s_w
               + np.arange(channels)[None, None, :] * s_c).ravel()
    return gemm.Gathered(image, rows, columns)


def _written_out(image, kernel, stride, dilation):
    """The window matrix by NumPy's strided view (the reference)."""
    batch, height, width, channels = image.shape
    out_h = (height - dilation[0] * (kernel[0] - 1) - 1) // stride[0] + 1
    out_w = (width - dilation[1] * (kernel[1] - 1) - 1) // stride[1] + 1
    s_b, s_h, s_w, s_c = image.strides
    view = np.lib.stride_tricks.as_strided(
        image, (batch, out_h, out_w, kernel[0], kernel[1], channels),
        (s_b, s_h * stride[0], s_w * stride[1], s_h * dilation[0], s_w * dilation[1], s_c))
    return np.ascontiguousarray(view).reshape(batch * out_h * out_w, -1)


GEOMETRIES = {"plain": ((3, 3), (1, 1), (1, 1)), "strided": ((3, 3), (2, 2), (1, 1)),
              "dilated": ((2, 3), (1, 1), (2, 1)), "one_by_one": ((1, 1), (1, 1), (1, 1))}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_a_gathered_window_matrix_is_the_written_out_one(geometry, dtype):
    image = np.random.default_rng(0).standard_normal((2, 7, 9, 32)).astype(dtype)
    windows = _windows(image, *GEOMETRIES[geometry])
    np.testing.assert_array_equal(windows.take(), _written_out(image, *GEOMETRIES[geometry]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("geometry", GEOMETRIES)
def test_products_of_gathered_windows_equal_the_gemm_of_the_written_out_windows_bit_for_bit(geometry, dtype):
    rng = np.random.default_rng(1)
    image = rng.standard_normal((3, 11, 10, 32)).astype(dtype)
    windows = _windows(image, *GEOMETRIES[geometry])
    matrix = np.ascontiguousarray(windows.take())
    right = rng.standard_normal((matrix.shape[1], 40)).astype(dtype)
    np.testing.assert_array_equal(gemm.matmul_gathered(windows, right), gemm.matmul(matrix, right))
    left = rng.standard_normal((matrix.shape[0], 24)).astype(dtype).T  # a transposed view, as a gradient's
    np.testing.assert_array_equal(gemm.matmul_gathered(left, windows), gemm.matmul(left, matrix))


def test_a_deep_gathered_product_is_cut_along_k_as_the_written_out_one_is():
    # (16, 4500) @ (4500, 288): K at least 4x the output's longer side: two halves summed.
    rng = np.random.default_rng(2)
    image = rng.standard_normal((5, 32, 32, 32)).astype(np.float32)
    windows = _windows(image)
    left = rng.standard_normal((16, windows.shape[0])).astype(np.float32)
    assert gemm._splits_k(16, windows.shape[1], windows.shape[0])
    want = gemm.matmul(left, np.ascontiguousarray(windows.take()))
    for threads in (1, 2):
        np.testing.assert_array_equal(gemm.matmul_gathered(left, windows, threads=threads), want)


def test_windows_whose_channels_break_the_packings_runs_are_not_gatherable_and_refused():
    # 3 channels: a window's row of 3 pixels is a run of 9 elements, and of 4 pixels of 12
    image = np.zeros((2, 6, 6, 3), np.float32)
    windows = _windows(image)
    assert not gemm.gatherable(windows, "a")  # (the transposes' blocks of 4 along K cross a run)
    # (27 columns, fewer than one B panel's: a partial panel, copied element by element.)
    assert gemm.gatherable(windows, "b")
    assert not gemm.gatherable(_windows(image, (4, 4)), "b")  # 48 columns in runs of 12
    with pytest.raises(ValueError, match="not read in runs"):
        gemm.matmul_gathered(windows, np.zeros((windows.shape[1], 8), np.float32))
    assert gemm.gatherable(_windows(np.zeros((2, 6, 6, 32), np.float32)), "b")
    assert not gemm.gatherable(_windows(np.zeros((2, 6, 6, tile_shape(np.dtype(np.float32))[1] // 2),
                                                np.float32)), "b")


def test_offsets_outside_the_source_are_refused_before_any_read():
    image = np.zeros((2, 4, 4, 8), np.float32)
    with pytest.raises(ValueError, match="outside the source"):
        gemm.Gathered(image, np.array([0, image.size]), np.arange(8))
    with pytest.raises(ValueError, match="outside the source"):
        gemm.Gathered(image, np.array([-1]), np.arange(8))


def test_a_gathered_operand_takes_a_new_source_of_its_geometry_only():
    image = np.ones((2, 5, 5, 32), np.float32)
    windows = _windows(image)
    other = windows.with_source(np.full_like(image, 2.0))
    assert other.rows is windows.rows and float(other.take()[0, 0]) == 2.0
    with pytest.raises(ValueError, match="with_source"):
        windows.with_source(np.ones((2, 5, 5, 16), np.float32))


# --- compiled convolutions ---------------------------------------------------------------------

@pytest.fixture
def every_product(monkeypatch):
    """Products of windows of any size take the gathered path."""
    monkeypatch.setattr(window_products, "MIN_WORK", 0)


def _conv_step(stride=1, padding=0, dilation=1):
    def step(x, w, b):
        out = F.conv2d(F.relu(x), w, b, stride=stride, padding=padding, dilation=dilation)
        loss = (out.tanh() ** 2).sum()
        return [out, *tg.autograd.grad(loss, [x, w, b])]
    return step


def _conv_inputs(channels, dtype, seed=0, size=9):
    rng = np.random.default_rng(seed)
    x = tg.tensor(rng.standard_normal((2, channels, size, size)), dtype=dtype, requires_grad=True)
    w = tg.tensor(rng.standard_normal((8, channels, 3, 3)) * 0.2, dtype=dtype, requires_grad=True)
    b = tg.tensor(rng.standard_normal(8), dtype=dtype, requires_grad=True)
    return x, w, b


def _window_steps(compiled) -> list:
    return [s for program in compiled._programs.values() for s in program.steps if isinstance(s, WindowProductStep)]


CONV_CASES = {"plain": {}, "strided": {"stride": 2}, "padded": {"padding": 1}, "dilated": {"dilation": 2}}


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
@pytest.mark.parametrize("case", CONV_CASES)
def test_a_compiled_convolution_reads_its_image_in_place_and_equals_eager(every_product, case, dtype):
    step = _conv_step(**CONV_CASES[case])
    inputs = _conv_inputs(32, dtype)
    want = step(*inputs)
    compiled = tg.compile(step)
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == tg.float32 else {"rtol": 1e-11, "atol": 1e-11}
    for _ in range(3):
        got = compiled(*inputs)
        for g, e in zip(got, want):
            np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), **tol)
    # The forward product and the weight gradient's, each reading the image through tables.
    assert sorted(s.side for s in _window_steps(compiled)) == ["left", "right"]


def test_a_compiled_convolution_with_window_products_passes_gradcheck_and_gradgradcheck(every_product):
    def conv(x, w):
        return F.conv2d(x, w, None, padding=1)

    x, w, _ = _conv_inputs(16, tg.float64, seed=3, size=5)
    compiled = tg.compile(conv)
    assert gradcheck(compiled, (x, w))
    assert gradgradcheck(compiled, (x, w))


def test_a_convolution_of_few_channels_keeps_its_written_out_windows(every_product):
    step = _conv_step()
    inputs = _conv_inputs(3, tg.float32)
    compiled = tg.compile(step)
    for g, e in zip(compiled(*inputs), step(*inputs)):
        np.testing.assert_allclose(g.detach().numpy(), e.detach().numpy(), rtol=1e-4, atol=1e-4)
    assert not _window_steps(compiled)


def test_a_small_convolution_keeps_its_written_out_windows():
    step = _conv_step()
    compiled = tg.compile(step)
    compiled(*_conv_inputs(32, tg.float32))
    assert not _window_steps(compiled)  # below MIN_WORK


def test_a_window_product_step_on_an_image_it_cannot_gather_runs_numpy():
    from tracegrad.ir.graph import Node, Value
    from tracegrad.ir.types import TensorType, float32
    from tracegrad.ops.window import WINDOW_PRODUCT
    rng = np.random.default_rng(4)
    image = rng.standard_normal((2, 32, 6, 6)).astype(np.float32).transpose(0, 2, 3, 1)  # channels strided
    right = rng.standard_normal((288, 5)).astype(np.float32)
    attrs = {"kernel": (3, 3), "stride": (1, 1), "dilation": (1, 1), "side": "left"}
    node = Node(WINDOW_PRODUCT, (Value(TensorType(image.shape, float32)), Value(TensorType(right.shape, float32))),
                attrs, (TensorType((32, 5), float32),))
    step = WindowProductStep(node, (0, 1), (2,))
    slots = [image, right, None]
    step.run(slots)
    np.testing.assert_allclose(slots[2], _written_out(image, (3, 3), (1, 1), (1, 1)) @ right, rtol=1e-5, atol=1e-5)
    assert step.tables[(image.shape, image.strides, image.dtype)] is None


def test_explain_pairs_a_program_with_window_products_with_its_plan(every_product):
    step = _conv_step()
    compiled = tg.compile(step)
    inputs = _conv_inputs(32, tg.float32)
    compiled(*inputs)
    report = str(compiled.explain(*inputs))  # (raises when the steps do not pair with the plan)
    assert "window_product" in report
