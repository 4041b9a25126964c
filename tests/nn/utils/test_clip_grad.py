"""`nn.utils.clip_grad_norm_`, `clip_grad_value_` and `get_total_norm`: the total norm of
every order (2, 1, inf, -inf, 0, fractional) and the scaled gradients as PyTorch's, the
non-finite check, parameters without gradients, and clipping inside `tg.compile`."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.nn.utils import clip_grad_norm_, clip_grad_value_, get_total_norm

GRADS = [np.array([[3.0, -4.0], [0.0, 1.0]]), np.array([-12.0, 0.5, 2.0])]


def _params_with_grads(grads=GRADS, dtype=np.float64):
    params = []
    for grad in grads:
        p = nn.Parameter(tg.zeros(*grad.shape, dtype=tg.float64 if dtype == np.float64 else tg.float32))
        p.grad = tg.tensor(grad.astype(dtype))
        params.append(p)
    return params


def _reference_norm(grads, norm_type):
    flat = np.concatenate([g.ravel() for g in grads])
    if norm_type == math.inf:
        return np.abs(flat).max()
    if norm_type == -math.inf:
        return np.abs(flat).min()
    if norm_type == 0:  # the norm of the per-tensor norms: tensors with a nonzero entry
        return float(sum(np.count_nonzero(g) > 0 for g in grads))
    return (np.abs(flat) ** norm_type).sum() ** (1 / norm_type)


@pytest.mark.parametrize("norm_type", [2.0, 1, math.inf, -math.inf, 0, 0.5, 3.0])
def test_total_norm_is_the_norm_of_all_gradients_together(norm_type):
    total = clip_grad_norm_(_params_with_grads(), max_norm=1e9, norm_type=norm_type)
    assert total.item() == pytest.approx(_reference_norm(GRADS, norm_type), rel=1e-12)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf])
def test_gradients_are_scaled_to_max_norm(norm_type):
    params = _params_with_grads()
    total = _reference_norm(GRADS, norm_type)
    clip_grad_norm_(params, max_norm=2.0, norm_type=norm_type)
    for p, grad in zip(params, GRADS):
        np.testing.assert_allclose(p.grad.numpy(), grad * 2.0 / (total + 1e-6), rtol=1e-12)
    assert _reference_norm([p.grad.numpy() for p in params], norm_type) == pytest.approx(2.0, rel=1e-6)


def test_gradients_under_max_norm_are_unchanged():
    params = _params_with_grads()
    clip_grad_norm_(params, max_norm=100.0)
    for p, grad in zip(params, GRADS):
        np.testing.assert_array_equal(p.grad.numpy(), grad)


def test_a_single_tensor_and_parameters_without_grad_are_accepted():
    with_grad = _params_with_grads(GRADS[:1])[0]
    without = nn.Parameter(tg.ones(2))
    assert clip_grad_norm_(with_grad, 1.0).item() == pytest.approx(math.sqrt(26))
    assert clip_grad_norm_([without], 1.0).item() == 0.0
    assert without.grad is None


def test_non_finite_norm_raises_only_when_asked():
    params = _params_with_grads([np.array([1.0, np.inf])])
    with pytest.raises(RuntimeError, match="The total norm of order 2.0 for gradients from `parameters` is "
                                           "non-finite"):
        clip_grad_norm_(params, 1.0, error_if_nonfinite=True)
    np.testing.assert_array_equal(params[0].grad.numpy(), [1.0, np.inf])  # untouched by the refusal
    assert math.isinf(clip_grad_norm_(params, 1.0).item())


def test_float32_gradients_stay_float32():
    params = _params_with_grads(dtype=np.float32)
    total = clip_grad_norm_(params, 1.0)
    assert all(p.grad.dtype == tg.float32 for p in params) and total.dtype == tg.float32


def test_get_total_norm_of_tensors():
    assert get_total_norm([tg.tensor(g) for g in GRADS], 1.0).item() == pytest.approx(_reference_norm(GRADS, 1))


def test_clip_grad_value_clamps_each_entry():
    params = _params_with_grads()
    clip_grad_value_(params, 2.5)
    for p, grad in zip(params, GRADS):
        np.testing.assert_array_equal(p.grad.numpy(), np.clip(grad, -2.5, 2.5))


def test_clipping_inside_compile_matches_eager():
    def make():
        tg.manual_seed(0)
        return nn.Linear(3, 2)
    x = tg.tensor(np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32) * 10)

    def step(model):
        def run(x):
            model.zero_grad()
            (model(x) ** 2).sum().backward()
            return clip_grad_norm_(model.parameters(), 0.5)
        return run
    eager_model, compiled_model = make(), make()
    eager_total = step(eager_model)(x)
    compiled_total = tg.compile(step(compiled_model))(x)
    assert compiled_total.item() == pytest.approx(eager_total.item(), rel=1e-5)
    for a, b in zip(eager_model.parameters(), compiled_model.parameters()):
        np.testing.assert_allclose(a.grad.numpy(), b.grad.numpy(), rtol=1e-5)


@pytest.mark.parametrize("norm_type", [2.0, 1.0, math.inf, -math.inf, 0, 0.5])
def test_matches_torch(norm_type):
    torch = pytest.importorskip("torch")
    theirs = [torch.zeros(g.shape, dtype=torch.float64, requires_grad=True) for g in GRADS]
    for t, g in zip(theirs, GRADS):
        t.grad = torch.tensor(g)
    ours = _params_with_grads()
    total = clip_grad_norm_(ours, 1.5, norm_type=norm_type)
    assert total.item() == pytest.approx(torch.nn.utils.clip_grad_norm_(theirs, 1.5, norm_type=norm_type).item(),
                                         rel=1e-12)
    for p, t in zip(ours, theirs):
        np.testing.assert_allclose(p.grad.numpy(), t.grad.numpy(), rtol=1e-12)
