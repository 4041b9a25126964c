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


def _grads_of(shapes, dtype=tg.float32, seed=0):
    rng = np.random.default_rng(seed)
    params = [tg.zeros(*shape, dtype=dtype, requires_grad=True) for shape in shapes]
    for p in params:
        p.grad = tg.tensor(rng.standard_normal(p.shape) * 3, dtype=dtype)
    return params


SHAPES = [(4, 5), (5,), (1, 1), (0, 3), (7, 2, 3)]


@pytest.mark.parametrize("dtype", [tg.float32, tg.float64])
def test_eager_clipping_takes_the_norms_in_one_op_with_the_composites_values(dtype, monkeypatch):
    from tracegrad.ops import grad_norms
    bound = []
    original = grad_norms.vector_norms
    monkeypatch.setattr(grad_norms, "vector_norms", lambda ts: bound.append(len(ts)) or original(ts))
    fast = _grads_of(SHAPES, dtype)
    total = nn.utils.clip_grad_norm_(fast, max_norm=1.0)
    assert bound == [len(SHAPES)]
    slow = _grads_of(SHAPES, dtype)
    with tg.enable_grad():  # (with grad: the composite of per-tensor ops)
        want_total = nn.utils.get_total_norm([p.grad for p in slow])
    assert bound == [len(SHAPES)]
    np.testing.assert_array_equal(total.numpy(), want_total.detach().numpy())
    with tg.no_grad():
        coef = (1.0 / (want_total.detach() + 1e-6)).clamp(max=1.0)
        for p in slow:
            p.grad.mul_(coef)
    for got, want in zip(fast, slow):
        np.testing.assert_array_equal(got.grad.numpy(), want.grad.numpy())


def test_mixed_dtypes_and_other_norms_take_the_composite():
    params = _grads_of([(3,)], tg.float32) + _grads_of([(2,)], tg.float64)
    total = nn.utils.clip_grad_norm_(params, max_norm=100.0)
    want = np.sqrt(sum(float((p.grad.numpy().astype(np.float64) ** 2).sum()) for p in params))
    np.testing.assert_allclose(total.item(), want, rtol=1e-6)
    inf_total = nn.utils.clip_grad_norm_(_grads_of(SHAPES), max_norm=100.0, norm_type="inf")
    assert inf_total.item() == max(float(np.abs(p.grad.numpy()).max(initial=0)) for p in _grads_of(SHAPES))


def test_the_norms_op_names_itself_and_the_types_on_bad_input():
    from tracegrad.ops import grad_norms
    with pytest.raises(RuntimeError, match="vector_norms: expected one or more float32 or float64 tensors"):
        grad_norms.vector_norms([tg.zeros(2), tg.zeros(2, dtype=tg.float64)])


@pytest.mark.parametrize("max_norm", [2.0, 0.5])
@pytest.mark.parametrize("norm_type", [2.0, 1, math.inf])
def test_compiled_clipping_equals_eager_and_takes_the_norms_and_the_scaling_in_one_step_each(norm_type, max_norm,
                                                                                            composite_jumps):
    def step(params):
        return nn.utils.clip_grad_norm_(params, max_norm=max_norm, norm_type=norm_type)

    compiled = tg.compile(step)
    for seed in range(3):
        eager_params, compiled_params = _grads_of(SHAPES, seed=seed), _grads_of(SHAPES, seed=seed)
        np.testing.assert_allclose(compiled(compiled_params).numpy(), step(eager_params).numpy(), rtol=1e-6)
        for got, want in zip(compiled_params, eager_params):
            # (each gradient times the coefficient, as its mul_ would make it)
            np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-6, atol=1e-7)
    assert composite_jumps.count("_total_norm") >= 1 and composite_jumps.count("_scaled") >= 1
