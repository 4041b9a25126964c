"""Eager composites run fused (`functional/eager_fusion.py`) give what op-by-op eager gives:
the same values, the same recorded graph and saved tensors, so backward, PyTorch's errors,
hooks, retain_graph and create_graph behave alike."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd.lru import RecencyCache
from tracegrad.runtime.program_cache import PROGRAMS
from tracegrad.functional import eager_fusion


@pytest.fixture(autouse=True)
def _fuse_everything(monkeypatch):
    """Fuse from the first call and whatever the size; fresh caches."""
    monkeypatch.delenv("TRACEGRAD_EAGER_COMPILE", raising=False)
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 0)
    monkeypatch.setattr(eager_fusion, "FUSE_AFTER", 1)
    monkeypatch.setattr(eager_fusion, "_seen", RecencyCache(eager_fusion.CAPACITY))
    monkeypatch.setattr(eager_fusion, "_programs", PROGRAMS.user("eager fusion", eager_fusion.RECIPE))
    monkeypatch.setattr(eager_fusion, "_op_programs", RecencyCache(eager_fusion.CAPACITY))


def _op_by_op(monkeypatch):
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 1 << 62)
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 1 << 62)


COMPOSITES = {  # name -> (function of (x, weight, bias, labels), whether weight/bias are used)
    "gelu": lambda x, w, b, y: F.gelu(x),
    "gelu_tanh": lambda x, w, b, y: F.gelu(x, approximate="tanh"),
    "silu": lambda x, w, b, y: F.silu(x),
    "softmax": lambda x, w, b, y: F.softmax(x, 1),
    "log_softmax": lambda x, w, b, y: F.log_softmax(x, 0),
    "layer_norm": lambda x, w, b, y: F.layer_norm(x, (5,), w, b, 1e-5),
    "cross_entropy": lambda x, w, b, y: F.cross_entropy(x, y),
}


# Op by op these are one primitive each (`ops/neural.py`), fused the composite's nodes: the
# same values and gradients, another grad_fn.
ONE_OP = {"softmax", "log_softmax", "cross_entropy"}


def _inputs(dtype):
    rng = np.random.default_rng(0)
    return (tg.tensor(rng.standard_normal((4, 5)) * 2, dtype=dtype, requires_grad=True),
            tg.tensor(rng.uniform(0.5, 1.5, 5), dtype=dtype, requires_grad=True),
            tg.tensor(rng.standard_normal(5), dtype=dtype, requires_grad=True),
            tg.tensor([0, 4, 2, 1]))


def _forward_and_grads(fn, dtype):
    x, w, b, y = _inputs(dtype)
    out = fn(x, w, b, y)
    (out * out).sum().backward()
    grads = [t.grad.numpy() if t.grad is not None else None for t in (x, w, b)]
    return out, grads


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
@pytest.mark.parametrize("name", COMPOSITES)
def test_fused_composite_matches_op_by_op(name, dtype, monkeypatch):
    fused_out, fused_grads = _forward_and_grads(COMPOSITES[name], dtype)
    assert eager_fusion._programs, "the call did not run fused"
    _op_by_op(monkeypatch)
    plain_out, plain_grads = _forward_and_grads(COMPOSITES[name], dtype)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype is tg.float64 else dict(rtol=2e-5, atol=1e-6)
    np.testing.assert_allclose(fused_out.detach().numpy(), plain_out.detach().numpy(), **tol)
    assert fused_out.dtype is plain_out.dtype
    if name not in ONE_OP:
        assert fused_out.grad_fn.name() == plain_out.grad_fn.name()
    for ours, theirs in zip(fused_grads, plain_grads):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            np.testing.assert_allclose(ours, theirs, **tol)


def _image_inputs(dtype, channels=3):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, channels, 7, 6))
    x[0, 0, :2, :2] = 0.0  # (a window of ties: max sends the gradient to one element)
    return (tg.tensor(x, dtype=dtype, requires_grad=True),
            tg.tensor(rng.standard_normal((4, channels // 2 if channels == 4 else channels, 3, 3)) * 0.3,
                      dtype=dtype, requires_grad=True),
            tg.tensor(rng.standard_normal(4), dtype=dtype, requires_grad=True))


IMAGE_COMPOSITES = {  # name -> (function of (x, weight, bias), input channels)
    "relu": (lambda x, w, b: F.relu(x), 3),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b), 3),
    "conv2d_no_bias_strided_padded": (lambda x, w, b: F.conv2d(x, w, None, stride=2, padding=1), 3),
    "conv2d_groups": (lambda x, w, b: F.conv2d(x, w, b, groups=2), 4),
    "max_pool2d": (lambda x, w, b: F.max_pool2d(F.relu(x), 2), 3),
    "max_pool2d_overlapping_padded": (lambda x, w, b: F.max_pool2d(x, 3, stride=2, padding=1), 3),
}


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
@pytest.mark.parametrize("name", IMAGE_COMPOSITES)
def test_fused_convolution_pooling_and_relu_match_op_by_op(name, dtype, monkeypatch):
    fn, channels = IMAGE_COMPOSITES[name]

    def run():
        x, w, b = _image_inputs(dtype, channels)
        out = fn(x, w, b)
        (out * out).sum().backward()
        return out, [t.grad.numpy() if t.grad is not None else None for t in (x, w, b)]

    fused_out, fused_grads = run()
    assert eager_fusion._programs, "the call did not run fused"
    _op_by_op(monkeypatch)
    plain_out, plain_grads = run()
    tol = dict(rtol=1e-12, atol=1e-13) if dtype is tg.float64 else dict(rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(fused_out.detach().numpy(), plain_out.detach().numpy(), **tol)
    assert fused_out.grad_fn.name() == plain_out.grad_fn.name() and fused_out.is_contiguous()
    for ours, theirs in zip(fused_grads, plain_grads):
        assert (ours is None) == (theirs is None)
        if ours is not None:
            np.testing.assert_allclose(ours, theirs, **tol)


@eager_fusion.fused
def _rows_of_squares(x):
    """A composite whose result is a view: a reshape of the squares it computes."""
    return (x * x).reshape(-1, x.shape[-1])


def test_a_fused_result_that_is_a_view_of_a_computed_tensor_is_one_as_op_by_op(monkeypatch):
    # The squares are computed by the program and the result viewed of them, so a write
    # into the result counts for both, as op by op.
    def run():
        x = tg.tensor(np.random.default_rng(2).standard_normal((2, 3, 6, 6)), requires_grad=True)
        out = _rows_of_squares(x)
        assert out._base is not None and out._base._data is not None
        version = out._base._version
        out.mul_(3.0)
        assert out._base._version == version + 1
        np.testing.assert_array_equal(out._base.detach().numpy().reshape(out.shape), out.detach().numpy())
        out.sum().backward()
        return out.detach().numpy(), x.grad.numpy()

    fused = run()
    assert eager_fusion._programs, "the call did not run fused"
    _op_by_op(monkeypatch)
    plain = run()
    for ours, theirs in zip(fused, plain):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)


def test_fused_result_owns_its_buffer_and_is_a_plain_eager_tensor():
    x = tg.randn(4, 5)
    out = F.gelu(x)
    assert eager_fusion._programs
    assert out.grad_fn is None and not out.requires_grad
    assert out.numpy().flags.owndata
    assert not np.shares_memory(out.numpy(), x.numpy())


def test_fused_call_under_no_grad_records_nothing():
    x = tg.randn(4, 5, requires_grad=True)
    with tg.no_grad():
        out = F.softmax(x, 1)
    assert out.grad_fn is None and not out.requires_grad


def test_input_modified_in_place_after_a_fused_call_raises_on_backward():
    a = tg.randn(4, 5, requires_grad=True)
    h = a * 1.0
    out = F.gelu(h, approximate="tanh")
    with tg.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_second_backward_through_a_fused_composite_raises():
    x = tg.randn(4, 5, requires_grad=True)
    loss = F.log_softmax(x, 1).sum()
    loss.backward()
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        loss.backward()


def test_retain_graph_through_a_fused_composite_accumulates_twice():
    x = tg.randn(4, 5, dtype=tg.float64, requires_grad=True)
    loss = (F.softmax(x, 1) * tg.arange(5.0, dtype=tg.float64)).sum()
    loss.backward(retain_graph=True)
    once = x.grad.numpy().copy()
    loss.backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * once, rtol=1e-12)


def test_second_order_gradient_through_a_fused_composite(monkeypatch):
    def second_derivative():
        x = tg.tensor([-1.5, -0.2, 0.3, 2.0], dtype=tg.float64, requires_grad=True)
        (g,) = tg.autograd.grad(F.gelu(x, approximate="tanh").sum(), x, create_graph=True)
        (gg,) = tg.autograd.grad(g.sum(), x)
        return gg.numpy()

    fused = second_derivative()
    _op_by_op(monkeypatch)
    np.testing.assert_allclose(fused, second_derivative(), rtol=1e-12)


def test_hook_on_a_fused_result_sees_its_gradient():
    x = tg.randn(4, 5, requires_grad=True)
    out = F.silu(x)
    seen = []
    out.register_hook(lambda g: seen.append(g.numpy().copy()))
    (out * 3.0).sum().backward()
    np.testing.assert_array_equal(seen[0], np.full((4, 5), 3.0, dtype=np.float32))


def test_errors_of_bad_arguments_are_the_op_by_op_errors():
    with pytest.raises(TypeError, match="expected target of class indices"):
        F.cross_entropy(tg.randn(4, 5), tg.randn(4))
    with pytest.raises(IndexError, match="out of bounds"):
        F.cross_entropy(tg.randn(4, 5), tg.tensor([0, 1, 7, 2]))


def test_small_tensors_and_first_sightings_run_op_by_op(monkeypatch):
    monkeypatch.setattr(eager_fusion, "FUSE_AFTER", 2)
    x = tg.randn(4, 5)
    F.gelu(x)
    assert not eager_fusion._programs  # first sighting
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 21)
    F.gelu(x)
    assert not eager_fusion._programs  # 20 elements: below the threshold
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 20)
    F.gelu(x)
    assert eager_fusion._programs


def test_composites_inside_a_compiled_function_are_traced_not_fused():
    f = tg.compile(lambda x: F.gelu(x).sum())
    x = tg.randn(4, 5)
    np.testing.assert_allclose(f(x).item(), F.gelu(x).sum().item(), rtol=1e-5)
    assert len(eager_fusion._programs) == 1  # the eager call only


def test_weight_updated_in_place_before_backward_raises():
    x = tg.randn(4, 5, requires_grad=True)
    weight = tg.ones(5, requires_grad=True)
    out = F.layer_norm(x, (5,), weight)
    with tg.no_grad():
        weight.mul_(2.0)  # as an optimizer step between forward and backward would
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_weight_updated_in_place_before_the_call_is_fine():
    x = tg.randn(4, 5, requires_grad=True)
    weight = tg.ones(5, requires_grad=True)
    with tg.no_grad():
        weight.mul_(2.0)  # version 1 before the forward: not a modification after saving
    F.layer_norm(x, (5,), weight).sum().backward()
    assert weight.grad is not None


def test_fused_broadcast_arithmetic_matches_op_by_op(monkeypatch):
    def run():
        x, w, b, _ = _inputs(tg.float64)
        out = (x * w + b) * 0.5 - x
        out.sum().backward()
        return out.detach().numpy(), [t.grad.numpy() for t in (x, w, b)]

    fused_out, fused_grads = run()
    assert eager_fusion._programs
    _op_by_op(monkeypatch)
    plain_out, plain_grads = run()
    np.testing.assert_allclose(fused_out, plain_out, rtol=1e-15)
    for ours, theirs in zip(fused_grads, plain_grads):
        np.testing.assert_allclose(ours, theirs, rtol=1e-13)


def test_arithmetic_on_bool_tensors_keeps_numpys_error():
    a = tg.tensor([True, False] * 8)
    for _ in range(2):
        with pytest.raises(TypeError, match="boolean subtract"):
            a - a


def test_weight_updated_in_place_before_backward_raises_for_a_size_zero_input():
    # The fused call's saved expand(weight) is a size-0 view of weight: it shares its version.
    weight = tg.ones(5, requires_grad=True)
    for _ in range(2):  # (the first sighting runs op by op)
        x = tg.zeros((0, 5), requires_grad=True)
        out = F.layer_norm(x, (5,), weight)
        with tg.no_grad():
            weight.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_a_transposed_argument_is_read_through_a_permute_not_copied_first():
    base = np.random.default_rng(5).standard_normal((2, 5, 4, 3))
    x = tg.from_numpy(base).permute(0, 3, 1, 2)  # NHWC data viewed as NCHW
    want = base.transpose(0, 3, 1, 2) / (1 + np.exp(-base.transpose(0, 3, 1, 2)))
    np.testing.assert_allclose(F.silu(x).numpy(), want, rtol=1e-12)
    (program,) = eager_fusion._programs.programs().values()
    assert program.input_types[0].shape == (2, 5, 4, 3)  # the array itself, in its own layout
    x_t = tg.from_numpy(base).transpose(1, 3)  # a transpose of a view that is no permute of C order
    np.testing.assert_allclose(F.silu(x_t[:, :2]).numpy(), F.silu(x_t[:, :2].contiguous()).numpy(), rtol=1e-12)


def test_transposed_source_recognises_only_permutations_of_c_order():
    a = np.zeros((2, 3, 4))
    assert eager_fusion._transposed_source(a) is None  # C order already
    source, perm = eager_fusion._transposed_source(a.transpose(2, 0, 1))
    assert source.flags.c_contiguous and np.shares_memory(source, a) and perm == (2, 0, 1)
    assert eager_fusion._transposed_source(a[:, ::2]) is None  # strided, not transposed
    assert eager_fusion._transposed_source(np.broadcast_to(a[:1], (5, 3, 4))) is None


def test_a_convolution_is_fused_by_the_size_of_its_output_not_of_its_input(monkeypatch):
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 1000)
    rng = np.random.default_rng(6)
    x = tg.from_numpy(rng.standard_normal((2, 1, 10, 10)))  # 200 elements
    wide, narrow = (tg.from_numpy(rng.standard_normal((n, 1, 3, 3))) for n in (8, 2))
    F.conv2d(x, narrow)  # ~400 elements out: op by op
    assert not eager_fusion._programs
    got = F.conv2d(x, wide)  # ~1600 out: one program
    assert eager_fusion._programs
    _op_by_op(monkeypatch)
    np.testing.assert_allclose(got.numpy(), F.conv2d(x, wide).numpy(), rtol=1e-12)
