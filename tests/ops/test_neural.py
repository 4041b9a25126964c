"""The one-op eager primitives `linear`, `softmax`, `log_softmax` (`ops/neural.py`): eager
calls record one node, with the composite's values, PyTorch's gradients and saved
tensors; traces still record the composite; compiled equals eager."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.functional import eager_fusion
from tracegrad.ops import neural

CHECKS = [gradcheck, gradgradcheck]


@pytest.fixture(autouse=True)
def _op_by_op(monkeypatch):
    """Eager calls take the op-by-op path whatever their size (no fused composites, each
    one-op primitive its NumPy implementation)."""
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 1 << 62)
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 1 << 62)


def _leaf(shape, seed=0, dtype=tg.float64):
    rng = np.random.default_rng(seed)
    return tg.tensor(rng.standard_normal(shape) * 2, dtype=dtype, requires_grad=True)


def _composite(fn, *args):
    """`fn(*args)` as the composite of primitives a trace records (the reference)."""
    with _traced_composite():
        return fn(*args)


class _traced_composite:
    """Make the functional layer believe a trace is current, so it takes the composite path."""

    def __enter__(self):
        from tracegrad.functional import neural as functional_neural
        self._saved = functional_neural.neural_ops.DTYPES
        functional_neural.neural_ops.DTYPES = ()
        return self

    def __exit__(self, *exc):
        from tracegrad.functional import neural as functional_neural
        functional_neural.neural_ops.DTYPES = self._saved


SOFTMAXES = {"softmax": F.softmax, "log_softmax": F.log_softmax}
SOFTMAX_SHAPES = {"rows": ((3, 5), 1), "columns": ((3, 5), 0), "3d_middle": ((2, 4, 3), 1),
                  "size_1_dim": ((4, 1), 1), "size_0_batch": ((0, 5), 1), "vector": ((6,), 0)}


@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_is_one_recorded_op_with_the_composites_values(name, shape):
    fn = SOFTMAXES[name]
    size, dim = SOFTMAX_SHAPES[shape]
    x = _leaf(size)
    out = fn(x, dim)
    assert out.grad_fn.name() == ("LogSoftmaxBackward" if name == "log_softmax" else "SoftmaxBackward")
    assert out.grad_fn.next_functions[0][0].name() == "AccumulateGrad"
    np.testing.assert_array_equal(out.detach().numpy(), _composite(fn, x, dim).detach().numpy())


@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_given_the_inputs_own_dtype_or_a_numpy_dim_is_the_same_one_op(name):
    fn = SOFTMAXES[name]
    x = _leaf((3, 5))
    want = fn(x, 1).detach().numpy()
    for out in (fn(x, 1, dtype=tg.float64), fn(x, np.int64(-1))):
        assert out.grad_fn.name() == ("LogSoftmaxBackward" if name == "log_softmax" else "SoftmaxBackward")
        np.testing.assert_array_equal(out.detach().numpy(), want)
    out = fn(x, 1, dtype=tg.float32)  # another dtype: converted first, then the composite
    assert out.dtype == tg.float32
    np.testing.assert_allclose(out.detach().numpy(), want, rtol=1e-6, atol=1e-6)
    with pytest.raises(IndexError, match="Dimension out of range"):
        fn(x, 2)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("shape", SOFTMAX_SHAPES)
@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_gradients(name, shape, check):
    size, dim = SOFTMAX_SHAPES[shape]
    assert check(lambda x: SOFTMAXES[name](x, dim), (_leaf(size),))


@pytest.mark.parametrize("name", SOFTMAXES)
def test_softmax_of_a_non_contiguous_view_and_its_gradient_match_the_composite(name):
    fn = SOFTMAXES[name]
    base = _leaf((5, 4))
    out = fn(base.t(), 1)
    (grad,) = tg.autograd.grad((out * out.detach().cos()).sum(), [base])
    want = _composite(fn, base.t(), 1)
    (want_grad,) = tg.autograd.grad((want * want.detach().cos()).sum(), [base])
    np.testing.assert_array_equal(out.detach().numpy(), want.detach().numpy())
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=1e-12, atol=1e-14)
    assert check_grad_views(lambda b: fn(b.t(), 1), base)


def check_grad_views(fn, base):
    return gradcheck(fn, (base,)) and gradgradcheck(fn, (base,))


@pytest.mark.parametrize("name", SOFTMAXES)
def test_rows_of_infinities_give_what_the_composite_gives(name):
    fn = SOFTMAXES[name]
    x = tg.tensor([[-np.inf, -np.inf, -np.inf], [1.0, np.inf, 0.0], [1.0, -np.inf, 2.0], [np.nan, 0.0, 1.0]],
                  requires_grad=True)
    out = fn(x, 1)
    np.testing.assert_array_equal(out.detach().numpy(), _composite(fn, x, 1).detach().numpy())


@pytest.mark.parametrize("name", SOFTMAXES)
def test_an_in_place_update_of_the_result_or_the_input_leaves_the_gradient_as_the_composites(name):
    # The composite saves intermediates nobody else sees, and compiled code runs it: the
    # one op saves a copy of its output (PyTorch refuses this backward; tracegrad runs it
    # right in every mode).
    fn = SOFTMAXES[name]
    x = _leaf((3, 4))
    weights = tg.tensor(np.random.default_rng(3).standard_normal((3, 4)))
    (want,) = tg.autograd.grad((fn(x * 1.0, 1) * weights).sum(), [x])
    out = fn(x * 1.0, 1)
    product = out * weights
    out.add_(1.0)
    (grad,) = tg.autograd.grad(product.sum(), [x])
    np.testing.assert_allclose(grad.numpy(), want.numpy(), rtol=1e-12, atol=1e-15)
    y = x * 1.0
    out = fn(y, 1)
    y.mul_(2.0)
    (grad,) = tg.autograd.grad((out * weights).sum(), [x])
    np.testing.assert_allclose(grad.numpy(), want.numpy(), rtol=1e-12, atol=1e-15)
    assert gradgradcheck(lambda x: fn(x, 1).add_(1.0), (_leaf((3, 4)),))  # double backward through it


LINEAR_SHAPES = {"rows": ((4, 3), 5), "batch": ((2, 3, 4), 6), "size_1": ((1, 1), 1),
                 "empty_batch": ((0, 3), 2), "empty_features": ((2, 0), 3), "no_outputs": ((2, 3), 0)}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", LINEAR_SHAPES)
def test_linear_is_one_recorded_op_with_the_composites_values(shape, bias):
    size, out_features = LINEAR_SHAPES[shape]
    x, w, b = _leaf(size), _leaf((out_features, size[-1]), 1), _leaf((out_features,), 2) if bias else None
    out = F.linear(x, w, b)
    node = out.grad_fn
    if len(size) > 2:  # a batch is folded into rows and the result unfolded, as in PyTorch
        assert node.name() == "ViewBackward"
        node = node.next_functions[0][0]
    assert node.name() == ("AddmmBackward" if bias else "MmBackward")
    np.testing.assert_array_equal(out.detach().numpy(), _composite(F.linear, x, w, b).detach().numpy())


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", LINEAR_SHAPES)
def test_linear_gradients(shape, bias, check):
    size, out_features = LINEAR_SHAPES[shape]
    args = (_leaf(size), _leaf((out_features, size[-1]), 1)) + ((_leaf((out_features,), 2),) if bias else ())
    assert check(F.linear, args)


def test_linear_of_views_matches_the_composite():
    x, w, b = _leaf((3, 5)), _leaf((3, 4), 1), _leaf((4,), 2)
    out = F.linear(x.t()[1:], w.t(), b)  # a sliced transpose and a transposed weight
    want = _composite(F.linear, x.t()[1:], w.t(), b)
    np.testing.assert_array_equal(out.detach().numpy(), want.detach().numpy())
    grads = tg.autograd.grad((out * out).sum(), [x, w, b])
    want_grads = tg.autograd.grad((want * want).sum(), [x, w, b])
    for got, expected in zip(grads, want_grads):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-12, atol=1e-13)


def test_linear_delivers_the_bias_gradient_before_the_weights_as_pytorchs_addmm():
    x, w, b = _leaf((3, 4)), _leaf((2, 4), 1), _leaf((2,), 2)
    order = []
    for name, t in (("w", w), ("b", b)):
        t.register_hook(lambda g, name=name: order.append(name))
    F.linear(x, w, b).sum().backward()
    assert order == ["b", "w"]


def test_linear_saves_what_each_gradient_needs_as_pytorch_does():
    x, w = _leaf((3, 4)), _leaf((2, 4), 1)
    frozen = w.detach()
    out = F.linear(x, frozen)  # the weight needs no grad: the input is not saved
    x.detach().mul_(2.0)
    out.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), np.ones((3, 2)) @ frozen.numpy())
    y = x * 1.0
    out = F.linear(y, w)
    y.add_(1.0)  # the weight's gradient reads the input: refused
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_linear_saves_a_folded_transposed_batch_as_the_copy_pytorch_makes():
    a = _leaf((5, 2, 3))
    w = _leaf((4, 3), 1)
    out = F.linear(a.transpose(0, 1), w)  # the fold copies this layout: the copy is saved
    with tg.no_grad():
        a.mul_(2.0)
    out.sum().backward()
    np.testing.assert_allclose(w.grad.numpy(), np.ones((4, 10)) @ (a.detach().numpy() / 2).transpose(1, 0, 2)
                               .reshape(10, 3))
    contiguous = a * 1.0
    out = F.linear(contiguous, w)  # a contiguous batch folds into a view: the input itself
    contiguous.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


def test_linear_in_place_on_a_non_leaf_result_and_detach():
    x, w, b = _leaf((3, 4)), _leaf((2, 4), 1), _leaf((2,), 2)
    out = F.linear(x, w, b)
    out.mul_(3.0)  # linear saves no output: the update is differentiated through
    out.sum().backward()
    np.testing.assert_allclose(b.grad.numpy(), np.full(2, 9.0))
    assert F.linear(x.detach(), w.detach(), b.detach()).grad_fn is None


def test_float32_and_other_dtypes_take_their_paths():
    x32, w32 = _leaf((2, 3), dtype=tg.float32), _leaf((4, 3), 1, dtype=tg.float32)
    assert F.linear(x32, w32).grad_fn.name() == "MmBackward"
    half = tg.randn(2, 3).to(tg.float16).requires_grad_()
    assert F.log_softmax(half, 1).grad_fn.name() != "LogSoftmaxBackward"  # the composite's nodes
    with pytest.raises(RuntimeError, match="linear: mat1 and mat2 shapes cannot be multiplied"):
        F.linear(x32, tg.randn(4, 5))


def test_a_bad_input_to_the_primitive_names_it_and_the_types():
    with pytest.raises(RuntimeError, match=r"log_softmax: expected a float32 or float64 tensor .* dim 1"):
        neural.log_softmax(tg.zeros(2, 0), 1)
    with pytest.raises(RuntimeError, match=r"linear: expected input \(N, in\)"):
        neural.linear(tg.zeros(2, 3), tg.zeros(4, 2))


def _model_step(x, w, b, labels):
    hidden = F.linear(x, w, b).tanh()
    loss = F.nll_loss(F.log_softmax(hidden, 1), labels) + F.softmax(hidden, 0).pow(2).sum()
    return loss, tg.autograd.grad(loss, [x, w, b], create_graph=True)


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
def test_compiled_equals_eager(dtype):
    compiled = tg.compile(_model_step)
    tol = dict(rtol=1e-12, atol=1e-13) if dtype is tg.float64 else dict(rtol=2e-5, atol=1e-6)
    for seed in range(2):
        args = (_leaf((5, 4), seed, dtype), _leaf((3, 4), seed + 1, dtype), _leaf((3,), seed + 2, dtype),
                tg.tensor([0, 2, 1, 1, 0]))
        (loss, grads), (want_loss, want_grads) = compiled(*args), _model_step(*args)
        np.testing.assert_allclose(loss.detach().numpy(), want_loss.detach().numpy(), **tol)
        for got, want in zip(grads, want_grads):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), **tol)


def test_compiled_gradients():
    args = (_leaf((5, 4)), _leaf((3, 4), 1), _leaf((3,), 2))
    step = tg.compile(lambda x, w, b: F.log_softmax(F.linear(x, w, b), 1) + F.softmax(x, 0).sum())
    assert gradcheck(step, args) and gradgradcheck(step, args)


def test_backward_of_an_eager_graph_inside_a_compiled_call():
    x, w = _leaf((4, 3)), _leaf((2, 3), 1)
    out = F.log_softmax(F.linear(x, w), 1)  # recorded eagerly: the one-op nodes

    want = tg.autograd.grad((out * out).sum(), [x, w], retain_graph=True)

    @tg.compile
    def grads(out):
        return tg.autograd.grad((out * out).sum(), [x, w])
    got = grads(out)
    for g, expected in zip(got, want):
        np.testing.assert_allclose(g.numpy(), expected.numpy(), rtol=1e-12)


def test_custom_function_around_the_primitives():
    class Scale(tg.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2.0

        @staticmethod
        def backward(ctx, g):
            return g * 2.0

    x = _leaf((3, 4))
    assert gradcheck(lambda x: F.log_softmax(Scale.apply(F.softmax(x, 1)), 0), (x,))


# reduction, ignore_index, which labels are ignore_index
NLL_CASES = {"mean": ("mean", -100, None), "sum": ("sum", -100, None), "none": ("none", -100, None),
             "some_ignored": ("mean", 1, slice(None, None, 2)), "all_ignored": ("mean", 7, slice(None)),
             "ignored_summed": ("sum", 2, slice(1, 3))}


def _labels(case, n=5, classes=3):
    _, ignore_index, ignored = NLL_CASES[case]
    labels = np.arange(n) % classes
    if ignored is not None:
        labels[ignored] = ignore_index
    return tg.tensor(labels)


@pytest.mark.parametrize("case", NLL_CASES)
@pytest.mark.parametrize("loss", ["nll_loss", "cross_entropy"])
def test_losses_are_one_op_after_log_softmax_with_the_composites_values(loss, case):
    reduction, ignore_index, _ = NLL_CASES[case]
    x = _leaf((5, 3))
    labels = _labels(case)
    fn = getattr(F, loss)
    out = fn(x, labels, reduction=reduction, ignore_index=ignore_index)
    assert out.grad_fn.name() == "NllLossBackward"
    want = _composite(fn, x, labels, None, None, ignore_index, None, reduction) if loss == "nll_loss" else \
        _composite(lambda *a: fn(*a, ignore_index=ignore_index, reduction=reduction), x, labels)
    np.testing.assert_array_equal(out.detach().numpy(), want.detach().numpy())
    grad = tg.autograd.grad(out.sum(), [x])[0]
    want_grad = tg.autograd.grad(want.sum(), [x])[0]
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("case", [case for case in NLL_CASES if case != "all_ignored"])  # (a NaN loss)
def test_nll_loss_gradients(case, check):
    reduction, ignore_index, _ = NLL_CASES[case]
    labels = _labels(case)
    assert check(lambda x: F.nll_loss(x, labels, reduction=reduction, ignore_index=ignore_index), (_leaf((5, 3)),))
    assert check(lambda x: F.cross_entropy(x, labels, reduction=reduction, ignore_index=ignore_index),
                 (_leaf((5, 3)),))


def test_nll_loss_of_an_empty_batch_and_a_single_class():
    empty = _leaf((0, 3))
    assert np.isnan(F.nll_loss(empty, tg.zeros(0, dtype=tg.int64)).item())  # 0 / 0, as PyTorch
    assert F.nll_loss(empty, tg.zeros(0, dtype=tg.int64), reduction="sum").item() == 0.0
    assert gradcheck(lambda x: F.cross_entropy(x, tg.zeros(4, dtype=tg.int64)), (_leaf((4, 1)),))


def test_a_label_out_of_range_is_pytorchs_error_before_anything_is_recorded():
    x = _leaf((3, 4))
    for fn in (F.nll_loss, F.cross_entropy):
        with pytest.raises(IndexError, match="Target 4 is out of bounds"):
            fn(x, tg.tensor([0, 4, 1]))


def test_nll_loss_saves_a_copy_of_its_targets_and_not_its_input():
    logp = _leaf((3, 4))
    labels = tg.tensor([0, 3, 1])
    loss = F.nll_loss(logp, labels)
    labels.fill_(2)  # (the composite saves the labels' where: an intermediate)
    logp.data.mul_(2.0)
    loss.backward()
    want = np.zeros((3, 4))
    want[[0, 1, 2], [0, 3, 1]] = -1 / 3
    np.testing.assert_allclose(logp.grad.numpy(), want)


# normalized dims, weight, bias
NORMS = {"affine": (1, True, True), "weight_only": (1, True, False), "bias_only": (1, False, True),
         "plain_two_dims": (2, False, False), "affine_two_dims": (2, True, True)}


def _norm_args(case, shape=(3, 4, 5), seed=0):
    normalized, weight, bias = NORMS[case]
    x = _leaf(shape, seed)
    w = _leaf(shape[len(shape) - normalized:], seed + 1) if weight else None
    b = _leaf(shape[len(shape) - normalized:], seed + 2) if bias else None
    return x, w, b, shape[len(shape) - normalized:]


@pytest.mark.parametrize("case", NORMS)
def test_layer_norm_is_one_op_with_the_composites_values(case):
    x, w, b, normalized = _norm_args(case)
    out = F.layer_norm(x, normalized, w, b)
    assert out.grad_fn.name() == "NativeLayerNormBackward"
    want = _composite(F.layer_norm, x, normalized, w, b)
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-13)
    params = [t for t in (x, w, b) if t is not None]
    grads = tg.autograd.grad((out * out.detach().sin()).sum(), params)
    want_grads = tg.autograd.grad((want * want.detach().sin()).sum(), params)
    for got, expected in zip(grads, want_grads):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("case", NORMS)
def test_layer_norm_gradients(case, check):
    x, w, b, normalized = _norm_args(case)
    params = tuple(t for t in (w, b) if t is not None)
    weight, bias = NORMS[case][1:]

    def fn(x, *params):
        return F.layer_norm(x, normalized, params[0] if weight else None, params[-1] if bias else None)
    assert check(fn, (x, *params))
    assert check(lambda x: F.layer_norm(x, (1,)), (_leaf((4, 1)),))  # one element per row
    assert check(lambda x: F.layer_norm(x.t(), (3,)), (_leaf((3, 2)),))  # a transposed view


def test_layer_norm_saves_a_copy_of_its_input_and_its_weight_itself():
    x, w, b, normalized = _norm_args("affine")
    h = x * 1.0
    out = F.layer_norm(h, normalized, w, b)
    with tg.no_grad():
        h.mul_(3.0)  # the composite saves only values computed from the input: fine
    (grad,) = tg.autograd.grad(out.sum() + (out * out).sum(), [x])
    (want,) = tg.autograd.grad(F.layer_norm(x * 1.0, normalized, w, b).sum()
                               + (F.layer_norm(x * 1.0, normalized, w, b) ** 2).sum(), [x])
    np.testing.assert_allclose(grad.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)
    out = F.layer_norm(x, normalized, w, b)
    with tg.no_grad():
        w.mul_(2.0)  # the weight is read by the input's gradient: refused, as by the composite
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


GELUS = ["none", "tanh"]


@pytest.mark.parametrize("approximate", GELUS)
def test_gelu_is_one_op_with_the_composites_values(approximate):
    x = _leaf((3, 7))
    out = F.gelu(x, approximate=approximate)
    assert out.grad_fn.name() == "GeluBackward"
    want = _composite(lambda t: F.gelu(t, approximate=approximate), x)
    np.testing.assert_allclose(out.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-14)
    (grad,) = tg.autograd.grad((out * out).sum(), [x])
    (want_grad,) = tg.autograd.grad((want * want).sum(), [x])
    np.testing.assert_allclose(grad.numpy(), want_grad.numpy(), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("approximate", GELUS)
def test_gelu_gradients(approximate, check):
    assert check(lambda x: F.gelu(x, approximate=approximate), (_leaf((2, 5)),))
    assert check(lambda x: F.gelu(x.t()[1:], approximate=approximate), (_leaf((4, 3)),))
    assert check(lambda x: F.gelu(x, approximate=approximate), (_leaf((0, 3)),))


def test_gelu_input_modified_in_place_before_backward_is_refused_as_by_the_composite():
    h = _leaf((3, 4)) * 1.0
    out = F.gelu(h)
    with tg.no_grad():
        h.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()


ONE_OPS = {"layer_norm": lambda x: F.layer_norm(x, x.shape[-1:]), "gelu": F.gelu,
           "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "softmax": lambda x: F.softmax(x, -1),
           "log_softmax": lambda x: F.log_softmax(x, 1)}


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
@pytest.mark.parametrize("name", ONE_OPS)
def test_from_its_second_call_the_op_runs_one_program_of_its_composite_with_numpys_values(name, dtype, monkeypatch):
    from tracegrad.autograd.lru import RecencyCache
    from tracegrad.runtime.program_cache import PROGRAMS
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 4)  # (the fixture's op-by-op threshold, lowered again)
    monkeypatch.setattr(eager_fusion, "_seen", RecencyCache(eager_fusion.CAPACITY))
    monkeypatch.setattr(eager_fusion, "_op_programs", RecencyCache(eager_fusion.CAPACITY))
    monkeypatch.setattr(eager_fusion, "_programs", PROGRAMS.user("eager fusion", eager_fusion.RECIPE))
    fn = ONE_OPS[name]
    base = _leaf((6, 5), 4, dtype)
    tol = dict(rtol=1e-12, atol=1e-13) if dtype is tg.float64 else dict(rtol=2e-5, atol=1e-6)
    for x in (base, base.t().contiguous().t()):  # row-major, then column-major: two programs
        results = [fn(x) for _ in range(eager_fusion.FUSE_AFTER + 1)]  # NumPy, then the program
        for result in results[1:]:
            np.testing.assert_allclose(result.detach().numpy(), results[0].detach().numpy(), **tol)
            assert result.detach().numpy().flags.owndata
            assert not np.shares_memory(result.detach().numpy(), x.detach().numpy())
        (grad,) = tg.autograd.grad(results[-1].sum(), [base])
        (want,) = tg.autograd.grad(results[0].sum(), [base])
        np.testing.assert_allclose(grad.numpy(), want.numpy(), **tol)
    assert len(eager_fusion._op_programs) == 2 and len(eager_fusion._programs) >= 1
    monkeypatch.setenv("TRACEGRAD_EAGER_COMPILE", "0")
    monkeypatch.setattr(eager_fusion, "_op_programs", RecencyCache(eager_fusion.CAPACITY))
    fn(base)
    assert len(eager_fusion._op_programs) == 0  # switched off: NumPy


# --- lstm_gates: an LSTM step's elementwise part ----------------------------------------------

@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
def test_from_its_second_call_lstm_gates_runs_one_program_of_both_results(dtype, monkeypatch):
    from tracegrad.autograd.lru import RecencyCache
    from tracegrad.runtime.program_cache import PROGRAMS
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 1)
    monkeypatch.setattr(eager_fusion, "_seen", RecencyCache(eager_fusion.CAPACITY))
    monkeypatch.setattr(eager_fusion, "_op_programs", RecencyCache(eager_fusion.CAPACITY))
    monkeypatch.setattr(eager_fusion, "_programs", PROGRAMS.user("eager fusion", eager_fusion.RECIPE))
    gates, c = _leaf((5, 12), 7, dtype), _leaf((5, 3), 8, dtype)
    tol = dict(rtol=1e-12, atol=1e-13) if dtype is tg.float64 else dict(rtol=2e-5, atol=1e-6)
    results = [neural.lstm_gates(gates, c) for _ in range(eager_fusion.FUSE_AFTER + 1)]  # NumPy, then the program
    assert len(eager_fusion._op_programs) == 1
    for h, c_next in results[1:]:
        np.testing.assert_allclose(h.detach().numpy(), results[0][0].detach().numpy(), **tol)
        np.testing.assert_allclose(c_next.detach().numpy(), results[0][1].detach().numpy(), **tol)
        assert h.grad_fn.name() == "LstmGatesBackward"
    grads = tg.autograd.grad((results[-1][0] * results[-1][1]).sum(), [gates, c])
    wants = tg.autograd.grad((results[0][0] * results[0][1]).sum(), [gates, c])
    for grad, want in zip(grads, wants):
        np.testing.assert_allclose(grad.numpy(), want.numpy(), **tol)


LSTM_SHAPES = {"batch": (3, 2), "one_row_one_unit": (1, 1), "empty_batch": (0, 2), "no_units": (2, 0)}


def _lstm_cell(seed=0, dtype=tg.float64, input_size=3, hidden=2):
    tg.manual_seed(seed)
    return tg.nn.LSTMCell(input_size, hidden).to(dtype)


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
def test_an_eager_lstm_step_records_its_gates_as_one_op_with_the_composites_values(dtype):
    cell = _lstm_cell(dtype=dtype)
    x, h, c = _leaf((4, 3), 1, dtype), _leaf((4, 2), 2, dtype), _leaf((4, 2), 3, dtype)
    h_next, c_next = cell(x, (h, c))
    assert h_next.grad_fn is c_next.grad_fn and h_next.grad_fn.name() == "LstmGatesBackward"
    with _traced_composite():
        want_h, want_c = cell(x, (h, c))
    assert want_h.grad_fn.name() == "MulBackward"
    np.testing.assert_array_equal(h_next.detach().numpy(), want_h.detach().numpy())
    np.testing.assert_array_equal(c_next.detach().numpy(), want_c.detach().numpy())
    assert h_next.is_contiguous() and c_next.is_contiguous() and h_next.dtype is dtype
    weights = [tg.tensor(np.random.default_rng(k).standard_normal((4, 2)), dtype=dtype) for k in (4, 5)]
    leaves = [x, h, c, *cell.parameters()]
    got = tg.autograd.grad((h_next * weights[0]).sum() + (c_next * weights[1]).sum(), leaves)
    want = tg.autograd.grad((want_h * weights[0]).sum() + (want_c * weights[1]).sum(), leaves)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype is tg.float64 else dict(rtol=1e-5, atol=1e-6)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), **tol)


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("shape", LSTM_SHAPES)
def test_lstm_gates_gradients(shape, check):
    n, hidden = LSTM_SHAPES[shape]
    gates, c = _leaf((n, 4 * hidden), 6), _leaf((n, hidden), 7)
    assert check(lambda gates, c: neural.lstm_gates(gates, c), (gates, c))
    assert check(lambda gates, c: neural.lstm_gates(gates, c)[0], (gates, c))  # (a zero gradient for c')


def test_lstm_gates_of_views_match_the_composite_and_one_needing_no_grad_is_skipped():
    cell = _lstm_cell()
    x, h = _leaf((3, 3), 1), _leaf((3, 2), 2)
    c = _leaf((2, 3), 3).t()  # (a transposed view)
    (h_next, c_next) = cell(x, (h, c))
    with _traced_composite():
        want = cell(x, (h, c))
    got = tg.autograd.grad((h_next * c_next).sum(), [x, c])
    expected = tg.autograd.grad((want[0] * want[1]).sum(), [x, c])
    for g, w in zip(got, expected):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-14)
    gates = _leaf((3, 8), 4)
    (grad,) = tg.autograd.grad(neural.lstm_gates(gates, tg.ones(3, 2, dtype=tg.float64))[1].sum(), [gates])
    assert grad.shape == (3, 8)


def test_lstm_cell_state_updated_in_place_before_backward_is_refused_as_by_the_composite():
    # The composite saves the cell state itself (the forget gate's product): both refuse.
    cell = _lstm_cell()
    x, h = _leaf((2, 3), 1), _leaf((2, 2), 2)
    errors = []
    for composite in (False, True):
        c = _leaf((2, 2), 3) * 1.0
        if composite:
            with _traced_composite():
                h_next, _ = cell(x, (h, c))
        else:
            h_next, _ = cell(x, (h, c))
        c.mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as raised:
            h_next.sum().backward()
        errors.append(str(raised.value).split(";")[0])
    assert errors[0] == errors[1]



def test_an_lstm_cell_state_needing_grad_alone_takes_the_composite_and_may_be_updated_in_place():
    # Its gradient reads c, which the composite saves only for the gates' gradient: the one
    # op, saving it likewise, had none to read (fuzz seed 81200415: AttributeError).
    from tracegrad import functional
    gates = _leaf((2, 8), 4).detach()
    grads = []
    for composite in (False, True):
        leaf = _leaf((2, 2), 3)
        c = leaf * 1.0
        if composite:
            with _traced_composite():
                h_next, c_next = functional.lstm_gates(gates, c)
        else:
            h_next, c_next = functional.lstm_gates(gates, c)
        assert h_next.grad_fn.name() != "LstmGatesBackward"
        total = (h_next * 2.0).sum() + c_next.sum()
        c.mul_(2.0)
        grads.append(tg.autograd.grad(total, [leaf])[0].numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-14)

def test_lstm_results_updated_in_place_leave_the_gradient_as_the_composites():
    # Neither saves h' or c' (the composite saves tanh(c'), a value of its own).
    cell = _lstm_cell()
    x, h, c = _leaf((2, 3), 1), _leaf((2, 2), 2), _leaf((2, 2), 3)
    (want,) = tg.autograd.grad(sum(t.sum() for t in cell(x, (h, c))), [x])
    h_next, c_next = cell(x, (h, c))
    total = h_next.sum() + c_next.sum()
    h_next.add_(1.0)
    c_next.mul_(3.0)
    (grad,) = tg.autograd.grad(total, [x])
    np.testing.assert_allclose(grad.numpy(), want.numpy(), rtol=1e-12, atol=1e-14)


def test_a_bad_input_to_lstm_gates_names_it_and_the_types():
    with pytest.raises(RuntimeError, match=r"lstm_gates: expected gates \(N, 4H\) and a cell state \(N, H\)"):
        neural.lstm_gates(tg.zeros(2, 7), tg.zeros(2, 2))
    with pytest.raises(RuntimeError, match=r"lstm_gates: .* got f32\[2,8\] and f64\[2,2\]"):
        neural.lstm_gates(tg.zeros(2, 8), tg.zeros(2, 2, dtype=tg.float64))


def test_layer_norm_gradient_of_an_infinite_cotangent_has_pytorchs_and_the_composites_nans():
    # PyTorch's CPU formula (dx = rstd g + b x + c, b and c from sums over the row) turns
    # one infinite cotangent into NaN across the row, as differentiating the composite
    # does; the form rstd (g - mean(g) - xhat mean(g xhat)) gave inf for some of it
    # (fuzz seed 76000779).
    x = tg.tensor([[-1.0, 0.25, 0.75]], requires_grad=True)  # (xhat: -, +, +)
    cotangent = tg.tensor([[1.0, -1.5, -np.inf]])
    (got,) = tg.autograd.grad(F.layer_norm(x, (3,)), [x], cotangent)
    with _traced_composite():
        (want,) = tg.autograd.grad(F.layer_norm(x, (3,)), [x], cotangent)
    np.testing.assert_array_equal(np.isnan(got.numpy()), np.isnan(want.numpy()))
    assert np.isnan(got.numpy()).all()


@pytest.mark.parametrize("shape, normalized", [((2, 0), (0,)), ((3, 0, 1), (0, 1)), ((0, 4), (4,))])
def test_layer_norm_over_empty_rows_or_an_empty_batch_has_the_composites_gradient(shape, normalized):
    # (A row of no elements: its count is 0; the gradient rule divides by it as a tensor,
    # as the composite does, where 1.0 / 0 in Python raised: fuzz seed 77000615.)
    x, weight = _leaf(shape, 1), _leaf(normalized, 2)
    out = F.layer_norm(x, normalized, weight)
    (got,) = tg.autograd.grad((out * out).sum(), [x])
    with _traced_composite():
        want_out = F.layer_norm(x, normalized, weight)
        (want,) = tg.autograd.grad((want_out * want_out).sum(), [x])
    assert got.shape == want.shape == x.shape
    np.testing.assert_array_equal(got.numpy(), want.numpy())
