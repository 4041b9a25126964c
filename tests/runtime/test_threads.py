"""Kernels split over threads (`runtime/threads.py`, `KernelStep.run`) compute what one
call computes: maps, row reductions and row groups write disjoint rows, and reductions
folded across the split loop are combined from per-chunk partial results."""

import os
import subprocess
import sys

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.runtime import threads
from tracegrad.codegen.kernels import KernelStep


@pytest.fixture
def split(monkeypatch):
    """Split every kernel, however small, into as many chunks as it allows."""
    def configure(count: int, min_elements: int = 1) -> None:
        monkeypatch.setattr(threads, "NUM_THREADS", count)
        monkeypatch.setattr(threads, "MIN_PARALLEL_ELEMENTS", min_elements)
        monkeypatch.setattr(threads, "MIN_CHUNK_ELEMENTS", 1)
    return configure


def _kernels(compiled) -> list[KernelStep]:
    return [s for p in compiled._programs.values() for s in p.steps if isinstance(s, KernelStep)]


def _run(fn, arrays, count: int):
    compiled = tg.compile(fn)
    outputs = compiled(*[tg.from_numpy(a).requires_grad_(True) for a in arrays])
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [o.detach().numpy() for o in outputs], compiled


def _layer_norm_grads(x, w, b):
    loss = (F.layer_norm(x, (x.shape[-1],), w, b) * 1.5).sum()
    return (loss, *tg.autograd.grad(loss, [x, w, b]))


def _arrays(*shapes, dtype=np.float32):
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(dtype) for shape in shapes]


CASES = {
    "map": (lambda x, y: (x * y + 1.0).tanh(), _arrays((37, 13), (37, 13))),
    "map with a broadcast operand": (lambda x, b: (x + b).exp(), _arrays((37, 13), (13,))),
    "transposed map (nested loop)": (lambda x: x.T * 2.0 + 1.0, _arrays((33, 7), dtype=np.float64)),
    "full sum": (lambda x: (x.exp() * 2.0).sum(), _arrays((37, 13))),
    "full amax": (lambda x: x.amax(), _arrays((5, 7, 3), dtype=np.float64)),
    "row sum": (lambda x: x.exp().sum(1), _arrays((37, 13))),
    "middle-axis sum": (lambda x: (x * 2.0).sum(1), _arrays((5, 7, 3), dtype=np.float64)),
    "column sum with a map output": (lambda x: ((x * 3.0).exp().sum(0), x.tanh()), _arrays((37, 13))),
    "softmax (row group)": (lambda x: F.softmax(x, 1), _arrays((37, 13))),
    "layer norm forward and backward": (lambda x, w, b: _layer_norm_grads(x, w, b),
                                        _arrays((37, 13), (13,), (13,), dtype=np.float64)),
}


@pytest.mark.parametrize("count", [2, 3, 5])
@pytest.mark.parametrize("case", list(CASES))
def test_split_kernels_compute_what_one_call_computes(split, case, count):
    fn, arrays = CASES[case]
    split(1)
    expected, _ = _run(fn, arrays, 1)
    split(count)
    got, compiled = _run(fn, arrays, count)
    assert max(step.chunk_count() for step in _kernels(compiled)) > 1
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)


def test_a_multi_output_kernel_with_folded_reductions_splits_every_output(split):
    split(2)
    x, w, b = _arrays((64, 32), (32,), (32,))

    def gelu_grads(x, w, b):
        loss = F.gelu(x * w + b, approximate="tanh").sum()
        return (loss, *tg.autograd.grad(loss, [x, w, b]))

    tensors = [tg.from_numpy(a).requires_grad_(True) for a in (x, w, b)]
    compiled = tg.compile(gelu_grads)
    got = [t.detach().numpy() for t in compiled(*tensors)]
    (kernel,) = [k for k in _kernels(compiled) if len(k.out_specs) > 2]
    assert kernel.folded and kernel.chunk_count() > 1
    expected = [t.detach().numpy() for t in gelu_grads(*tensors)]
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-4, atol=1e-5)


def test_split_results_do_not_depend_on_thread_timing(split):
    split(2)
    (x,) = _arrays((64, 100))
    compiled = tg.compile(lambda x: ((x * 1.7).exp().sum(), (x + 1.0).tanh().sum(0)))
    first = [o.numpy() for o in compiled(tg.from_numpy(x))]
    for _ in range(10):
        again = [o.numpy() for o in compiled(tg.from_numpy(x))]
        for a, b in zip(first, again):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("elements", [40, 49, 70, 99, 100, 101, 127, 128, 129])
def test_sizes_around_the_threshold(split, elements):
    # A kernel's size is its elements, or an eighth of the bytes it reads and writes when
    # more: the float64 map below moves 16 bytes per element (size 2 x elements). (Its
    # chunks start every 64 elements: from 50 to 64 elements it has one chunk to give.)
    split(2, min_elements=100)
    (x,) = _arrays((elements,), dtype=np.float64)
    compiled = tg.compile(lambda x: ((x * 2.0).abs() + 1.0, (x * x).sum() + x.sum()))
    got = [o.numpy() for o in compiled(tg.from_numpy(x))]
    np.testing.assert_allclose(got[0], np.abs(x * 2.0) + 1.0, rtol=1e-12)
    np.testing.assert_allclose(got[1], (x * x).sum() + x.sum(), rtol=1e-12)
    sizes = sorted((step.size, step.chunk_count()) for step in _kernels(compiled))
    assert sizes[-1][0] == 2 * elements  # (the map, its sums folded into its loop)
    assert all((count > 1) == (size >= 100) for size, count in sizes)


@pytest.mark.parametrize("rows", [3, 6, 7, 8])
def test_transcendentals_count_toward_a_kernels_size(split, rows):
    # A tanh costs three elements' worth of work, an exp two (`Primitive.element_cost`): a
    # map of n float32 elements computing both counts as 4n (its bytes as about n), and
    # splits from 4n >= 100 on. (A broadcast operand keeps it a nest of rows.)
    split(2, min_elements=100)
    x, b = _arrays((rows, 4), (4,))
    compiled = tg.compile(lambda x, b: (x * b).tanh().exp())
    got = compiled(tg.from_numpy(x), tg.from_numpy(b)).numpy()
    np.testing.assert_allclose(got, np.exp(np.tanh(x * b)), rtol=1e-6)
    (step,) = _kernels(compiled)
    assert step.size == 4 * 4 * rows
    assert (step.chunk_count() > 1) == (4 * 4 * rows >= 100)


def test_one_thread_runs_every_kernel_in_one_call(split):
    split(1)
    (x,) = _arrays((64, 64))
    _, compiled = _run(lambda x: x.exp().sum(1), [x], 1)
    assert [step.chunk_count() for step in _kernels(compiled)] == [1]


def test_small_kernels_stay_one_call_by_default():
    (x,) = _arrays((16, 16))
    _, compiled = _run(lambda x: x.exp(), [x], 1)
    assert [step.thread_count() for step in _kernels(compiled)] == [1]


def test_an_error_in_a_worker_chunk_is_raised_in_the_caller():
    def fail(message):
        raise ValueError(message)

    with pytest.raises(ValueError, match="chunk"):
        threads.run_parallel([(len, "a"), (fail, "chunk"), (len, "b")], 1)


def _threads_in_child(value: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "TRACEGRAD_NUM_THREADS": value}
    return subprocess.run([sys.executable, "-c", "from tracegrad.runtime import threads; print(threads.NUM_THREADS)"],
                          env=env, capture_output=True, text=True, timeout=60)


def test_environment_variable_sets_the_thread_count():
    assert _threads_in_child("1").stdout.strip() == "1"
    assert _threads_in_child("3").stdout.strip() == "3"


def test_a_bad_thread_count_warns_and_keeps_the_default():
    done = _threads_in_child("many")
    assert "TRACEGRAD_NUM_THREADS='many' is not an integer" in done.stderr
    assert int(done.stdout) >= 1


def test_a_one_iteration_kernel_has_constant_bounds_and_honours_an_empty_range():
    # With the range's runtime bounds, LLVM's loop vectorizer ran for minutes on a loop
    # whose every access is at index 0 (a random graph of (1,)-shaped values).
    x = tg.tensor([0.3], dtype=tg.float64)
    compiled = tg.compile(lambda x: ((x * x + 1).log().sin() * x).clamp(-0.5, 0.5))
    np.testing.assert_allclose(compiled(x).numpy(), np.clip(np.sin(np.log(0.09 + 1)) * 0.3, -0.5, 0.5), rtol=1e-12)
    (step,) = [s for p in compiled._programs.values() for s in p.steps if isinstance(s, KernelStep)]
    assert step.extent == 1
    assert "loop.head" not in step.llvm_ir().split("br i1")[0]  # the guard comes before any loop
    out = np.full(1, 7.0)
    pointers = step.pointer_array(out.ctypes.data, *[0] * (len(step.inputs)))
    step.function(__import__("ctypes").addressof(pointers), 0, 0)  # an empty range writes nothing
    assert out[0] == 7.0


def test_kernel_built_below_the_threshold_runs_whole_after_it_is_lowered(split):
    x, y = _arrays((37, 13), (37, 13))
    expected, compiled = _run(lambda x, y: (x * y + 1.0).tanh(), [x, y], 1)
    (kernel,) = _kernels(compiled)
    assert kernel.whole
    split(2)
    assert kernel.chunk_count() == 1
    got = compiled(tg.from_numpy(x).requires_grad_(True), tg.from_numpy(y).requires_grad_(True))
    np.testing.assert_array_equal(got.detach().numpy(), expected[0])


def test_kernel_built_at_or_above_the_threshold_is_split(split):
    split(2, min_elements=100)
    x, y = _arrays((37, 13), (37, 13))
    _, compiled = _run(lambda x, y: (x * y + 1.0).tanh(), [x, y], 2)
    (kernel,) = _kernels(compiled)
    assert not kernel.whole and kernel.chunk_count() > 1
