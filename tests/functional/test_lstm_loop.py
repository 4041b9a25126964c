"""An LSTM layer's time loop run natively (`functional/lstm_loop.py`): the Python loop's
values to the bit, taken only where that loop runs its products generated and its gates
compiled, from a geometry's second sighting; anything else runs the Python loop."""

import threading

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import reference
from tracegrad.functional import eager_fusion, lstm_loop
from tracegrad.ops import lstm_layer
from tracegrad.runtime import threads


@pytest.fixture
def native_calls(monkeypatch):
    """Whether each layer ran natively (True) or through the Python loop (False)."""
    monkeypatch.setattr(lstm_loop, "_layers", lstm_loop.RecencyCache(lstm_loop.CAPACITY))
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    calls = []

    def spy(*args):
        result = lstm_loop.native_layer(*args)
        calls.append(result is not None)
        return result
    monkeypatch.setattr(lstm_layer, "_native_loop", spy)
    return calls


def _python_loop(*args):
    saved = lstm_layer._native_loop
    lstm_layer._native_loop = None
    try:
        return lstm_layer._lstm_layer_impl(*args)
    finally:
        lstm_layer._native_loop = saved


def _layer_inputs(steps, batch, hidden, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((steps, batch, 4 * hidden)).astype(dtype),
            rng.standard_normal((batch, hidden)).astype(dtype), rng.standard_normal((batch, hidden)).astype(dtype),
            (rng.standard_normal((4 * hidden, hidden)) / np.sqrt(hidden)).astype(dtype),
            rng.standard_normal(4 * hidden).astype(dtype))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape", [(12, 20, 200), (5, 64, 100), (2, 33, 96)])
def test_the_native_loop_gives_the_python_loops_values_to_the_bit(native_calls, shape, reverse, dtype):
    args = _layer_inputs(*shape, dtype)
    for _ in range(3):  # (the Python loop's gates and products compiled by now)
        want = _python_loop(*args, reverse)
    for _ in range(3):
        got = lstm_layer._lstm_layer_impl(*args, reverse)
    assert native_calls == [False, True, True]  # (from the geometry's second sighting)
    for array, expected in zip(got, want):
        assert array.dtype == expected.dtype and array.flags.c_contiguous
        np.testing.assert_array_equal(array, expected)


def test_each_run_reads_its_own_arrays_and_weights(native_calls):
    first, second = _layer_inputs(7, 20, 200, np.float32, 1), _layer_inputs(9, 20, 200, np.float32, 2)
    for _ in range(3):
        lstm_layer._lstm_layer_impl(*first, False)
    got = lstm_layer._lstm_layer_impl(*second, False)
    assert native_calls[-1]
    for array, expected in zip(got, _python_loop(*second, False)):
        np.testing.assert_array_equal(array, expected)


def test_one_thread_or_two_give_the_same_values(native_calls, monkeypatch):
    args = _layer_inputs(6, 20, 200, np.float32, 3)
    results = []
    for count in (1, 2):
        monkeypatch.setattr(threads, "NUM_THREADS", count)
        for _ in range(3):
            results.append(lstm_layer._lstm_layer_impl(*args, False))
    assert native_calls[-1] and native_calls[2]
    for array, expected in zip(results[-1], results[2]):
        np.testing.assert_array_equal(array, expected)


def test_another_thread_runs_its_own_native_loop(native_calls):
    args = _layer_inputs(6, 20, 200, np.float32, 4)
    want = [lstm_layer._lstm_layer_impl(*args, False) for _ in range(3)][-1]
    got = []
    worker = threading.Thread(target=lambda: got.extend(lstm_layer._lstm_layer_impl(*args, False) for _ in range(3)))
    worker.start()
    worker.join()
    assert native_calls[-1]
    for array, expected in zip(got[-1], want):
        np.testing.assert_array_equal(array, expected)


@pytest.mark.parametrize("setting", ["small product", "numpy products", "gates by numpy", "no eager compile",
                                     "reference mode"])
def test_the_python_loop_runs_where_its_values_would_differ(native_calls, monkeypatch, setting):
    shape = (6, 20, 200)
    if setting == "small product":  # (the Python loop's products run through NumPy's BLAS)
        shape = (6, 3, 8)
    elif setting == "numpy products":
        monkeypatch.setenv("TRACEGRAD_MATMUL", "numpy")
    elif setting == "gates by numpy":
        monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 1 << 62)
    elif setting == "no eager compile":
        monkeypatch.setenv("TRACEGRAD_EAGER_COMPILE", "0")
    else:
        monkeypatch.setattr(reference, "ACTIVE", True)
    args = _layer_inputs(*shape, np.float32, 5)
    for _ in range(3):
        lstm_layer._lstm_layer_impl(*args, False)
    assert native_calls == [False] * 3


def test_an_lstm_trained_with_the_native_loop_matches_the_composites_gradients(native_calls):
    tg.manual_seed(0)
    lstm = tg.nn.LSTM(32, 200, 2)
    x = tg.randn(8, 20, 32)
    state = (tg.randn(2, 20, 200), tg.randn(2, 20, 200))
    grads = []
    for _ in range(3):
        lstm.zero_grad()
        out, (h, c) = lstm(x, state)
        (out.square().mean() + h.sum() + c.mean()).backward()
        grads.append([p.grad.numpy().copy() for p in lstm.parameters()])
    assert native_calls[-2:] == [True, True]
    for got, want in zip(grads[-1], grads[0]):  # (the first step's Python loop)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_a_weight_of_another_layout_gets_a_loop_of_its_own(native_calls):
    gi, h0, c0, w_hh, b_hh = _layer_inputs(6, 20, 200, np.float32, 6)
    for _ in range(3):
        lstm_layer._lstm_layer_impl(gi, h0, c0, w_hh, b_hh, False)
    transposed = np.asfortranarray(w_hh)  # (the same values, column-major)
    results = [lstm_layer._lstm_layer_impl(gi, h0, c0, transposed, b_hh, False) for _ in range(2)]
    assert native_calls[-2:] == [False, True]  # (a new geometry: sighted once first)
    for array, expected in zip(results[-1], _python_loop(gi, h0, c0, w_hh, b_hh, False)):
        np.testing.assert_array_equal(array, expected)
