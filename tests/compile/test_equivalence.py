"""Compiled vs eager: forward values and gradients of every core op and composite.

Each case is (name, fn, input specs). Float inputs require grad; the gradient is taken of
`(fn(*inputs) * w).sum()` with a fixed random `w`, so every output element gets a distinct
weight. Gradients are computed inside the compiled function, once with
`tg.autograd.grad` and once with `loss.backward()` (reading the leaves' `.grad` after).
"""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F


class Float:
    """A float input that requires grad. `transposed`: a non-contiguous view (arr.T)."""

    def __init__(self, *shape, low=-2.0, high=2.0, dtype=np.float64, transposed=False):
        self.shape, self.low, self.high = shape, low, high
        self.dtype, self.transposed = dtype, transposed

    def build(self, rng):
        if self.transposed:
            array = rng.uniform(self.low, self.high, self.shape[::-1]).astype(self.dtype).T
            assert not array.flags.c_contiguous
        else:
            array = rng.uniform(self.low, self.high, self.shape).astype(self.dtype)
        return tg.from_numpy(array).requires_grad_()


class Const:
    """An input that does not require grad (indices, masks, labels, targets)."""

    def __init__(self, make):
        self.make = make

    def build(self, rng):
        return tg.from_numpy(np.asarray(self.make(rng)))


def _away_from_ties(rng, shape):
    """Distinct values (so max/argmax/abs/relu have a unique, well-defined gradient)."""
    n = int(np.prod(shape))
    values = (rng.permutation(n) - n / 2 + 0.5) * (4.0 / n)
    return values.reshape(shape)


class Distinct(Float):
    def build(self, rng):
        return tg.from_numpy(_away_from_ties(rng, self.shape).astype(self.dtype)).requires_grad_()


def _positive(*shape, **kw):
    return Float(*shape, low=0.5, high=3.0, **kw)


def _ints(*shape):
    return Const(lambda r: r.integers(-50, 50, shape))


M = (3, 4)
CASES = [
    # arithmetic, with broadcasting and non-contiguous operands
    ("add", lambda a, b: a + b, [Float(*M), Float(4)]),
    ("add_transposed", lambda a, b: a + b, [Float(*M, transposed=True), Float(*M)]),
    ("sub_broadcast_column", lambda a, b: a - b, [Float(*M), Float(3, 1)]),
    ("mul", lambda a, b: a * b, [Float(*M), Float(*M)]),
    ("mul_scalar", lambda a: a * 2.5 - 1.0, [Float(*M)]),
    ("div", lambda a, b: a / b, [Float(*M), _positive(4)]),
    ("rdiv_scalar", lambda a: 2.0 / a, [_positive(*M)]),
    ("pow_scalar", lambda a: a ** 3, [Float(*M)]),
    ("pow_tensor", lambda a, b: a ** b, [_positive(*M), Float(*M)]),
    ("rpow_scalar", lambda a: 2.0 ** a, [Float(*M)]),
    ("matmul", lambda a, b: a @ b, [Float(3, 5), Float(5, 4)]),
    ("matmul_transposed", lambda a, b: a @ b, [Float(3, 5, transposed=True), Float(5, 4)]),
    ("matmul_batched_broadcast", lambda a, b: a @ b, [Float(2, 3, 5), Float(5, 4)]),
    ("matmul_vector", lambda a, b: a @ b, [Float(3, 5), Float(5)]),
    ("neg", lambda a: -a, [Float(*M)]),
    ("abs", lambda a: a.abs(), [Distinct(*M)]),
    # transcendental
    ("exp", lambda a: a.exp(), [Float(*M)]),
    ("log", lambda a: a.log(), [_positive(*M)]),
    ("sqrt", lambda a: a.sqrt(), [_positive(*M)]),
    ("rsqrt", lambda a: a.rsqrt(), [_positive(*M)]),
    ("sin", lambda a: a.sin(), [Float(*M)]),
    ("cos", lambda a: a.cos(), [Float(*M)]),
    ("tanh", lambda a: a.tanh(), [Float(*M)]),
    ("sigmoid", lambda a: a.sigmoid(), [Float(*M)]),
    ("erf", lambda a: a.erf(), [Float(*M)]),
    ("exp_transposed", lambda a: a.exp(), [Float(*M, transposed=True)]),
    # piecewise
    ("relu", lambda a: a.relu(), [Distinct(*M)]),
    ("maximum", lambda a, b: tg.maximum(a, b), [Distinct(*M), Float(4)]),
    ("minimum", lambda a, b: tg.minimum(a, b), [Distinct(*M), Float(3, 1)]),
    ("clamp", lambda a: a.clamp(-0.55, 0.45), [Distinct(*M)]),
    ("clamp_min_only", lambda a: a.clamp(min=0.05), [Distinct(*M)]),
    ("where", lambda c, a, b: tg.where(c, a, b),
     [Const(lambda r: r.uniform(size=M) > 0.5), Float(*M), Float(4)]),
    ("where_from_comparison", lambda a, b: tg.where(a > b, a * 2, b.exp()), [Distinct(*M), Float(4)]),
    # reductions
    ("sum_all", lambda a: a.sum(), [Float(*M)]),
    ("sum_dim", lambda a: a.sum(0), [Float(*M)]),
    ("sum_dims_keepdim", lambda a: a.sum((0, 2), keepdim=True), [Float(2, 3, 4)]),
    ("sum_transposed", lambda a: a.sum(1), [Float(*M, transposed=True)]),
    ("mean", lambda a: a.mean(-1), [Float(*M)]),
    ("mean_all", lambda a: a.mean(), [Float(*M)]),
    ("max_dim_values", lambda a: a.max(1)[0], [Distinct(*M)]),
    ("max_all", lambda a: a.max(), [Distinct(*M)]),
    ("min_dim_keepdim", lambda a: a.min(0, keepdim=True)[0], [Distinct(*M)]),
    ("amax", lambda a: a.amax(-1), [Distinct(*M)]),
    ("amin_keepdim", lambda a: a.amin(0, keepdim=True), [Distinct(*M)]),
    ("var", lambda a: a.var(1), [Float(*M)]),
    ("var_biased_all", lambda a: a.var(unbiased=False), [Float(*M)]),
    ("std", lambda a: a.std(0, keepdim=True), [Float(*M)]),
    ("logsumexp", lambda a: a.logsumexp(-1), [Float(*M)]),
    ("softmax", lambda a: a.softmax(-1), [Float(*M)]),
    ("softmax_dim0", lambda a: a.softmax(0), [Float(*M)]),
    ("softmax_transposed", lambda a: a.softmax(-1), [Float(*M, transposed=True)]),
    ("log_softmax", lambda a: a.log_softmax(-1), [Float(*M)]),
    # movement
    ("reshape", lambda a: a.reshape(2, 6) * 2, [Float(*M)]),
    ("reshape_transposed", lambda a: a.reshape(12).exp(), [Float(*M, transposed=True)]),
    ("view", lambda a: a.view(4, 3).sin(), [Float(*M)]),
    ("flatten", lambda a: a.flatten(1) + 1, [Float(2, 3, 2)]),
    ("transpose", lambda a: a.transpose(0, 1).exp(), [Float(*M)]),
    ("dot_T", lambda a: a.T * 3, [Float(*M)]),
    ("permute", lambda a, b: a.permute(2, 0, 1) * b, [Float(2, 3, 4), Float(2, 3)]),
    ("unsqueeze", lambda a, b: a.unsqueeze(1) * b, [Float(3), Float(3, 4)]),
    ("squeeze", lambda a: a.squeeze(1).cos(), [Float(3, 1, 4)]),
    ("expand", lambda a: a.expand(3, 4) * 2, [Float(3, 1)]),
    ("slice", lambda a: a[1:, ::2] * 2, [Float(*M)]),
    ("slice_negative_step_int", lambda a: a[2, 1:3].exp(), [Float(*M)]),
    ("slice_none_ellipsis", lambda a: a[..., None, :2], [Float(*M)]),
    ("index_int_array", lambda a, i: a[i], [Float(*M), Const(lambda r: np.array([2, 0, 2, 1]))]),
    ("index_int_array_dim1", lambda a, i: a[:, i], [Float(*M), Const(lambda r: np.array([3, 1, 3]))]),
    ("index_two_arrays", lambda a: a[[0, 2, 1], [3, 3, 0]], [Float(*M)]),
    ("boolean_mask", lambda a, m: a[m] * 2, [Float(*M), Const(lambda r: r.uniform(size=M) > 0.4)]),
    ("boolean_mask_from_values", lambda a: a[a > 0].exp(), [Distinct(*M)]),
    ("cat", lambda a, b: tg.cat([a, b], 1), [Float(*M), Float(3, 2)]),
    ("cat_transposed", lambda a, b: tg.cat([a, b.exp()], 0), [Float(*M, transposed=True), Float(*M)]),
    ("stack", lambda a, b: tg.stack([a, b], 1), [Float(*M), Float(*M)]),
    ("gather", lambda a, i: a.gather(1, i), [Float(*M), Const(lambda r: r.integers(0, 4, (3, 2)))]),
    ("clone", lambda a: a.clone() * a, [Float(*M)]),
    ("contiguous", lambda a: a.T.contiguous().exp(), [Float(*M)]),
    ("to_float32", lambda a: a.to(tg.float32).to(tg.float64) * 2, [Float(*M)]),
    # neural composites
    ("gelu", lambda a: F.gelu(a), [Float(*M)]),
    ("gelu_tanh", lambda a: F.gelu(a, approximate="tanh"), [Float(*M)]),
    ("silu", lambda a: F.silu(a), [Float(*M)]),
    ("layer_norm", lambda a, w, b: F.layer_norm(a, (4,), w, b), [Float(*M), Float(4), Float(4)]),
    ("layer_norm_no_affine", lambda a: F.layer_norm(a, (4,)), [Float(*M)]),
    ("linear", lambda a, w, b: F.linear(a, w, b), [Float(*M), Float(5, 4), Float(5)]),
    ("mse_loss", lambda a, b: F.mse_loss(a, b), [Float(*M), Float(*M)]),
    ("cross_entropy", lambda a, y: F.cross_entropy(a, y),
     [Float(*M), Const(lambda r: r.integers(0, 4, 3))]),
    ("dropout_p0", lambda a: F.dropout(a, p=0.0) * 2, [Float(*M)]),
]

# Cases whose output is not differentiable: forward only.
FORWARD_ONLY = [
    ("lt", lambda a, b: a < b, [Distinct(*M), Float(4)]),
    ("le", lambda a, b: a <= b, [Distinct(*M), Float(3, 1)]),
    ("gt", lambda a: a > 0.1, [Distinct(*M)]),
    ("ge", lambda a, b: a >= b, [Distinct(*M, transposed=True), Float(*M)]),
    ("eq", lambda a: a == a.clamp(-0.5, 0.5), [Float(*M)]),
    ("ne", lambda a, b: a != b, [Float(*M), Float(4)]),
    ("argmax", lambda a: a.argmax(1), [Distinct(*M)]),
    ("argmax_all", lambda a: a.argmax(), [Distinct(*M)]),
    ("argmin_keepdim", lambda a: a.argmin(0, keepdim=True), [Distinct(*M)]),
    ("max_dim_indices", lambda a: a.max(1)[1], [Distinct(*M)]),
    ("to_int64_truncates", lambda a: (a * 3).to(tg.int64), [Float(*M)]),
    ("int_arithmetic", lambda i, j: i * 3 - j + i * j, [_ints(*M), _ints(4)]),
    ("int_true_division", lambda i: i / 4, [_ints(*M)]),
    ("int_sum", lambda i: i.sum(0), [_ints(*M)]),
    ("int_amax_amin", lambda i: i.amax(1) - i.amin(1), [_ints(*M)]),
    ("int_abs_neg", lambda i: -i.abs(), [_ints(*M)]),
    ("bool_logic", lambda a, b: tg.logical_and(a > 0, tg.logical_not(b < 0.5)) | (a < -1),
     [Float(*M), Float(4)]),
    ("bool_sum", lambda a: (a > 0).sum(1), [Float(*M)]),
]

FLOAT32_CASES = [
    ("add", lambda a, b: a * b + a, [Float(*M, dtype=np.float32), Float(4, dtype=np.float32)]),
    ("exp_log", lambda a: a.exp() + a.abs().log(),
     [Distinct(*M, dtype=np.float32)]),
    ("tanh_sigmoid", lambda a: a.tanh() * a.sigmoid(), [Float(*M, dtype=np.float32)]),
    ("softmax", lambda a: a.softmax(-1), [Float(*M, dtype=np.float32)]),
    ("layer_norm", lambda a: F.layer_norm(a, (4,)), [Float(*M, dtype=np.float32)]),
    ("gelu", lambda a: F.gelu(a), [Float(*M, dtype=np.float32)]),
    ("sum_dim", lambda a: a.sum(0), [Float(*M, dtype=np.float32, transposed=True)]),
]


def _ids(cases):
    return [c[0] for c in cases]


def _tol(dtype):
    if dtype == np.float32:
        return {"rtol": 1e-5, "atol": 1e-6}
    return {"rtol": 1e-10, "atol": 1e-12}


def _inputs(specs):
    rng = np.random.default_rng(1234)
    return [spec.build(rng) for spec in specs]


def _grad_inputs(inputs):
    return [t for t in inputs if t.requires_grad]


def _weight(fn, inputs):
    """A fixed random weight shaped like the output (so each output element matters)."""
    out = fn(*inputs)
    rng = np.random.default_rng(99)
    return tg.from_numpy(rng.uniform(0.5, 1.5, out.shape).astype(_np(out).dtype))


def _np(value):
    return value.detach().numpy() if isinstance(value, tg.Tensor) else np.asarray(value)


def _assert_close(actual, expected, dtype):
    expected = _np(expected)
    actual = _np(actual)
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    np.testing.assert_allclose(actual, expected, **_tol(dtype))


def _dtype(inputs):
    return _np(inputs[0]).dtype


@pytest.mark.parametrize("name, fn, specs", CASES + FORWARD_ONLY, ids=_ids(CASES + FORWARD_ONLY))
def test_forward_matches_eager(name, fn, specs):
    inputs = _inputs(specs)
    expected = fn(*inputs)
    actual = tg.compile(fn)(*inputs)
    _assert_close(actual, expected, _dtype(inputs))
    assert actual.requires_grad == expected.requires_grad


@pytest.mark.parametrize("name, fn, specs", FLOAT32_CASES, ids=_ids(FLOAT32_CASES))
def test_float32_forward_matches_eager(name, fn, specs):
    inputs = _inputs(specs)
    actual = tg.compile(fn)(*inputs)
    _assert_close(actual, fn(*inputs), np.float32)


def _autograd_grads(fn, inputs, w):
    loss = (fn(*inputs) * w).sum()
    return [loss] + list(tg.autograd.grad(loss, _grad_inputs(inputs)))


@pytest.mark.parametrize("name, fn, specs", CASES, ids=_ids(CASES))
def test_autograd_grad_matches_eager(name, fn, specs):
    inputs = _inputs(specs)
    w = _weight(fn, inputs)

    def run(w, *xs):
        return _autograd_grads(fn, xs, w)

    expected = run(w, *inputs)
    actual = tg.compile(run)(w, *inputs)
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        _assert_close(a, e, _dtype(inputs))


@pytest.mark.parametrize("name, fn, specs", FLOAT32_CASES, ids=_ids(FLOAT32_CASES))
def test_float32_autograd_grad_matches_eager(name, fn, specs):
    inputs = _inputs(specs)
    w = _weight(fn, inputs)

    def run(w, *xs):
        return _autograd_grads(fn, xs, w)

    expected = run(w, *inputs)
    actual = tg.compile(run)(w, *inputs)
    for a, e in zip(actual, expected):
        _assert_close(a, e, np.float32)


def _backward_grads(fn, inputs, w, compiled):
    def run(w, *xs):
        loss = (fn(*xs) * w).sum()
        loss.backward()
        return loss

    for t in inputs:
        t.grad = None
    loss = (tg.compile(run) if compiled else run)(w, *inputs)
    grads = [t.grad for t in _grad_inputs(inputs)]
    assert all(g is not None for g in grads)
    return [loss.detach().numpy()] + [g.numpy().copy() for g in grads]


@pytest.mark.parametrize("name, fn, specs", CASES, ids=_ids(CASES))
def test_backward_grad_matches_eager(name, fn, specs):
    inputs = _inputs(specs)
    w = _weight(fn, inputs)
    expected = _backward_grads(fn, inputs, w, compiled=False)
    actual = _backward_grads(fn, inputs, w, compiled=True)
    for a, e in zip(actual, expected):
        _assert_close(a, e, _dtype(inputs))


def test_backward_accumulates_into_existing_grad_like_eager():
    fn = CASES[0][1]
    inputs = _inputs(CASES[0][2])
    w = _weight(fn, inputs)

    def run(w, *xs):
        (fn(*xs) * w).sum().backward()

    for t in inputs:
        t.grad = None
    run(w, *inputs)
    run(w, *inputs)
    expected = [t.grad.numpy().copy() for t in inputs]
    for t in inputs:
        t.grad = None
    compiled = tg.compile(run)
    compiled(w, *inputs)
    compiled(w, *inputs)
    for t, e in zip(inputs, expected):
        _assert_close(t.grad.numpy(), e, np.float64)


def _cached_case(x):
    y = (x.T @ x).tanh() + x.sum(0)
    return y, tg.autograd.grad((y * y).sum(), x)[0]


def test_cache_hit_with_new_values_matches_eager():
    compiled = tg.compile(_cached_case)
    rng = np.random.default_rng(5)
    for _ in range(3):
        x = tg.from_numpy(rng.normal(size=(4, 3))).requires_grad_()
        for a, e in zip(compiled(x), _cached_case(x)):
            _assert_close(a, e, np.float64)
    assert compiled.cache_info().hits == 2


def test_cache_hit_with_a_non_contiguous_input_of_the_same_shape_matches_eager():
    compiled = tg.compile(_cached_case)
    rng = np.random.default_rng(6)
    compiled(tg.from_numpy(rng.normal(size=(4, 3))).requires_grad_())
    x = tg.from_numpy(rng.normal(size=(3, 4)).T).requires_grad_()
    for a, e in zip(compiled(x), _cached_case(x)):
        _assert_close(a, e, np.float64)


def test_cache_hit_with_a_python_scalar_changed_matches_eager():
    def fn(x, s):
        return (x * s).exp().sum(-1) / s

    compiled = tg.compile(fn)
    x = tg.from_numpy(np.random.default_rng(7).normal(size=(3, 4)))
    for s in (0.5, -1.25, 3.0):
        _assert_close(compiled(x, s), fn(x, s), np.float64)
    assert compiled.cache_info().misses == 1


# Sums reassociate (fast-math `reassoc` only, no `nsz`), which must not lose a NaN.
def test_sum_of_inf_minus_itself_is_nan_as_in_eager():
    def fn(a):
        return (a - a).sum(-1)

    x = tg.from_numpy(np.full((2, 3), np.inf))
    _assert_close(tg.compile(fn)(x), fn(x), np.float64)


def test_gradient_of_var_over_one_element_is_nan_as_in_eager():
    def fn(x, b):
        return tg.autograd.grad((b + x).var(0).sum(), b)[0]

    x = tg.from_numpy(np.array([[0.7]])).requires_grad_()
    b = tg.from_numpy(np.array(0.3)).requires_grad_()
    _assert_close(tg.compile(fn)(x, b), fn(x, b), np.float64)


def test_negated_zero_of_zero_fill_keeps_its_sign_as_in_eager():
    # zero_ traces as full(0); neg of it folds to full(-0.0), which the optimizer once
    # merged with full(0): 1/-0 gave +inf (fuzz seed 6006246).
    def fn(a):
        t = a * 1.0
        t.zero_()
        u = tg.neg(t)
        return t, u, u ** -1

    a = tg.tensor(2.0)
    for got, want in zip(tg.compile(fn)(a), fn(a)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert np.signbit(got.numpy()) == np.signbit(want.numpy())
