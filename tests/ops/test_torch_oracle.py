"""PyTorch as the oracle: forward values and gradients of a sample of ops, including
PyTorch's choices at ties and kinks, compared with torch on the same float64 inputs."""

import numpy as np
import pytest

import tracegrad as tg

torch = pytest.importorskip("torch")

ORACLE = {  # name -> (function of a module namespace `m` and inputs, input shapes)
    "broadcast_arithmetic": (lambda m, a, b: (a * b - a / (b * b + 1.0)) ** 2.0, [(2, 3), (3,)]),
    "unary_chain": (lambda m, a: m.tanh(m.sin(a) * m.exp(-a.abs())) + m.sigmoid(a).sqrt(), [(2, 3)]),
    "erf": (lambda m, a: m.erf(a), [(5,)]),
    "maximum_minimum": (lambda m, a, b: m.maximum(a, b) + 2.0 * m.minimum(a, b), [(2, 3), (2, 3)]),
    "clamp": (lambda m, a: a.clamp(-0.5, 0.5), [(3, 4)]),
    "relu": (lambda m, a: a.relu(), [(3, 4)]),
    "matmul_batched": (lambda m, a, b: a @ b, [(2, 3, 4), (4, 2)]),
    "matmul_vector": (lambda m, a, b: a @ b, [(4,), (2, 4, 3)]),
    "var_std": (lambda m, a: a.var(1) + a.std(0, keepdim=True).sum() + a.var(dim=1, correction=0), [(3, 4)]),
    "logsumexp": (lambda m, a: a.logsumexp(-1), [(3, 4)]),
    "softmax": (lambda m, a: m.softmax(a, -1) * m.log_softmax(a, 0), [(3, 4)]),
    "amax": (lambda m, a: a.amax(0) + a.amin((0, 1)), [(3, 4)]),
    "max_dim": (lambda m, a: a.max(1).values * a.min(0)[0].sum(), [(3, 4)]),
    "indexing": (lambda m, a: a[1:, ::2].sum() + a[[0, 2, 0]] * a[a > 0].sum() + a[None, ..., 1].sum(), [(3, 4)]),
    "movement": (lambda m, a: a.T.reshape(2, 6).unsqueeze(0).expand(2, 2, 6).permute(2, 0, 1).flatten(), [(3, 4)]),
    "cat_stack": (lambda m, a, b: m.cat([a, b], -1) * m.stack([b, a], 1).reshape(2, 6), [(2, 3), (2, 3)]),
}


def run(module, fn, arrays):
    if module is torch:
        inputs = [torch.tensor(a, requires_grad=True) for a in arrays]
    else:
        inputs = [tg.tensor(a, requires_grad=True) for a in arrays]
    out = fn(module, *inputs)
    weights = np.linspace(-1.0, 1.0, int(np.prod(out.shape))).reshape(out.shape)
    (out * (torch.tensor(weights) if module is torch else tg.tensor(weights))).sum().backward()
    return out.detach().numpy(), [x.grad.numpy() for x in inputs]


def random_inputs(shapes, ties):
    arrays = [np.random.standard_normal(s) for s in shapes]
    if ties:  # rounding creates ties and zeros: the oracle checks the choices made there
        arrays = [np.round(a) for a in arrays]
    return arrays


@pytest.mark.parametrize("ties", [False, True], ids=["generic", "ties_and_zeros"])
@pytest.mark.parametrize("name", ORACLE)
def test_forward_and_gradients_match_torch(name, ties):
    fn, shapes = ORACLE[name]
    arrays = random_inputs(shapes, ties)
    expected_out, expected_grads = run(torch, fn, arrays)
    out, grads = run(tg, fn, arrays)
    np.testing.assert_allclose(out, expected_out, rtol=1e-10, atol=1e-12)
    for grad, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected, rtol=1e-10, atol=1e-12)


NAN = float("nan")
# name -> (function of `m` and inputs, input arrays): PyTorch's values and gradients where
# an input is NaN, ties, zero spread or a size-0 dim.
EDGE_ORACLE = {
    "maximum_minimum_at_nan": (lambda m, a, b: m.maximum(a, b) + 3.0 * m.minimum(a, b),
                               [[NAN, 1.0, NAN, 2.0, 1.0], [1.0, NAN, NAN, 2.0, 3.0]]),
    "clamp_at_nan": (lambda m, a: a.clamp(0.0, 2.0) + 2.0 * a.clamp(min=0.0) + 3.0 * a.clamp(max=0.0),
                     [[NAN, 1.0, 0.0, 2.0, -1.0, 3.0]]),
    "clamp_tensor_bounds_at_nan": (lambda m, a, lo, hi: a.clamp(lo, hi),
                                   [[NAN, 1.0, 0.0, -1.0, 3.0], [0.0, NAN, 0.0, 0.0, 0.0], [2.0, 2.0, NAN, 2.0, 2.0]]),
    "clamp_crossed_bounds": (lambda m, a: a.clamp(3.0, 1.0), [[NAN, 1.0, 0.0, -1.0, 3.0]]),
    "relu_sign_abs_at_nan": (lambda m, a: a.relu() + a.sign() + a.abs(), [[NAN, -0.0, 0.0, 2.0, -3.0]]),
    "amax_ties": (lambda m, a: a.amax() + a.amin(0), [[1.0, 3.0, 3.0, 1.0]]),
    "amax_of_nan": (lambda m, a: a.amax(), [[1.0, NAN, 3.0, NAN]]),
    "std_var_zero_spread": (lambda m, a: a.std(1) + a.var(1) + a.std(), [[[1.0, 1.0, 1.0], [1.0, 2.0, 4.0]]]),
    "empty_sum_mean": (lambda m, a: a.sum(0) + a.sum() + a.mean(0), [np.zeros((0, 3))]),
    "empty_softmax_logsumexp": (lambda m, a: m.softmax(a, 1).sum() + m.log_softmax(a, 1).sum() + a.logsumexp(1).exp(),
                                [np.zeros((2, 0))]),
    "softmax_with_infinities": (lambda m, a: m.softmax(a, 1) + m.log_softmax(a, 1),
                                [[[np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, 1.0]]]),
    "cross_entropy_with_infinities": (
        lambda m, a: m.nn.functional.cross_entropy(a, m.tensor([1, 0, 2]), reduction="none"),
        [[[np.inf, 0.0, 1.0], [-np.inf, -np.inf, -np.inf], [-np.inf, 0.0, 1.0]]]),
    "softmax_of_0d": (lambda m, a: m.softmax(a, 0) + m.log_softmax(a, -1), [np.array(3.0)]),
}


def run_compiled(fn, arrays):
    """`run` for tracegrad with the forward and backward in one compiled function."""
    @tg.compile
    def step(*inputs):
        out = fn(tg, *inputs)
        weights = np.linspace(-1.0, 1.0, int(np.prod(out.shape))).reshape(out.shape)
        (out * tg.tensor(weights)).sum().backward()
        return out

    inputs = [tg.tensor(a, requires_grad=True) for a in arrays]
    out = step(*inputs)
    return out.detach().numpy(), [x.grad.numpy() for x in inputs]


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("name", EDGE_ORACLE)
def test_values_and_gradients_at_nan_ties_and_empty_dims_match_torch(name, compiled):
    fn, data = EDGE_ORACLE[name]
    arrays = [np.asarray(d, dtype=np.float64) for d in data]
    with np.errstate(all="ignore"):
        expected_out, expected_grads = run(torch, fn, arrays)
    out, grads = run_compiled(fn, arrays) if compiled else run(tg, fn, arrays)
    np.testing.assert_allclose(out, expected_out, rtol=1e-10, atol=1e-12)
    for grad, expected in zip(grads, expected_grads):
        np.testing.assert_allclose(grad, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_every_target_ignored_matches_torch(reduction):
    logits = np.random.standard_normal((3, 4))
    results = []
    for module in (torch, tg):
        x = module.tensor(logits, requires_grad=True)
        loss = module.nn.functional.cross_entropy(x, module.tensor([-100, -100, -100]), reduction=reduction)
        loss.sum().backward()
        results.append((loss.detach().numpy(), x.grad.numpy()))
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_cross_entropy_with_ignore_index_matches_torch(reduction):
    logits = np.random.standard_normal((4, 3))
    target = np.array([2, -100, 0, 1])
    results = []
    for module in (torch, tg):
        x = module.tensor(logits, requires_grad=True)
        loss = module.nn.functional.cross_entropy(x, module.tensor(target), reduction=reduction)
        loss.sum().backward()
        results.append((loss.detach().numpy(), x.grad.numpy()))
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_matches_torch(approximate):
    data = np.linspace(-4.0, 4.0, 17)
    results = []
    for module in (torch, tg):
        x = module.tensor(data, requires_grad=True)
        out = module.nn.functional.gelu(x, approximate=approximate)
        out.sum().backward()
        results.append((out.detach().numpy(), x.grad.numpy()))
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_layer_norm_matches_torch():
    data = np.random.standard_normal((2, 3, 4))
    weight, bias = np.random.standard_normal(4), np.random.standard_normal(4)
    results = []
    for module in (torch, tg):
        x, w, b = (module.tensor(a, requires_grad=True) for a in (data, weight, bias))
        out = module.nn.functional.layer_norm(x, (4,), w, b)
        (out * out).sum().backward()
        results.append([out.detach().numpy(), x.grad.numpy(), w.grad.numpy(), b.grad.numpy()])
    for ours, theirs in zip(results[1], results[0]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-8, atol=1e-10)


PROMOTIONS = {
    "float32_times_python_float": lambda m: m.ones(2) * 2.5,
    "int_div_int": lambda m: m.tensor([3, 4]) / 2,
    "int_plus_float": lambda m: m.tensor([1, 2]) + 0.5,
    "float32_plus_float64": lambda m: m.ones(2) + m.ones(2, dtype=m.float64),
    "float32_times_0d_float64": lambda m: m.ones(2) * m.tensor(2.0, dtype=m.float64),
    "int_times_0d_float64": lambda m: m.tensor([1, 2]) * m.tensor(2.0, dtype=m.float64),
    "bool_plus_int": lambda m: m.tensor([True]) + 1,
    "int_pow_float": lambda m: m.tensor([2]) ** 0.5,
    "argmax": lambda m: m.ones(2, 3).argmax(1),
    "comparison": lambda m: m.ones(2) < 2,
    "sum_of_bool": lambda m: m.tensor([True, True]).sum(),
}


@pytest.mark.parametrize("name", PROMOTIONS)
def test_result_dtype_matches_torch(name):
    expression = PROMOTIONS[name]
    assert str(expression(tg).dtype).split(".")[-1] == str(expression(torch).dtype).split(".")[-1]
