"""`optim.LBFGS`: a closure-driven quasi-Newton step. It minimizes a quadratic and the
Rosenbrock function, takes PyTorch's exact steps (with and without the strong Wolfe line
search, with a short history), counts its evaluations and refuses parameter groups."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn, optim
from tracegrad.optim.lbfgs import _cubic_interpolate

START = np.array([-1.5, 2.0, 0.5, -0.8])


def _rosenbrock(lib, x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def _closure(optimizer, p, calls=None):
    def closure():
        if calls is not None:
            calls.append(1)
        optimizer.zero_grad()
        loss = _rosenbrock(tg, p)
        loss.backward()
        return loss
    return closure


def _run(steps, start=START, **options):
    p = nn.Parameter(tg.tensor(start))
    optimizer = optim.LBFGS([p], **options)
    history = []
    for _ in range(steps):
        optimizer.step(_closure(optimizer, p))
        history.append(p.detach().numpy().copy())
    return history, optimizer


def test_strong_wolfe_minimizes_the_rosenbrock_function():
    # (from START it ends in the 4-d function's local minimum near (-0.78, 0.61, 0.38, 0.15))
    history, _ = _run(5, start=np.array([0.5, 0.8, 1.2, 0.9]), line_search_fn="strong_wolfe", max_iter=50)
    np.testing.assert_allclose(history[-1], np.ones(4), atol=1e-4)  # stops at tolerance_grad 1e-7


def test_a_quadratic_is_solved_in_a_few_iterations():
    a = np.array([[3.0, 1.0], [1.0, 2.0]])
    b = np.array([1.0, -1.0])
    p = nn.Parameter(tg.zeros(2, dtype=tg.float64))
    optimizer = optim.LBFGS([p], line_search_fn="strong_wolfe")

    def closure():
        optimizer.zero_grad()
        loss = 0.5 * (p @ tg.tensor(a) @ p) - (tg.tensor(b) * p).sum()
        loss.backward()
        return loss
    optimizer.step(closure)
    np.testing.assert_allclose(p.detach().numpy(), np.linalg.solve(a, b), atol=1e-6)  # tolerance_grad 1e-7


def test_step_returns_the_loss_of_the_first_evaluation():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.LBFGS([p], max_iter=3)
    loss = optimizer.step(_closure(optimizer, p))
    assert loss.item() == pytest.approx(float(_rosenbrock(np, START)))


def test_evaluations_stop_at_max_eval():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.LBFGS([p], lr=1e-3, max_iter=100, max_eval=7)
    calls = []
    optimizer.step(_closure(optimizer, p, calls))
    assert len(calls) == 7 == optimizer.state[p]["func_evals"]


def test_history_keeps_at_most_history_size_pairs():
    _, optimizer = _run(3, lr=0.01, max_iter=10, history_size=3)
    state = next(iter(optimizer.state.values()))
    assert len(state["old_dirs"]) == len(state["old_stps"]) == len(state["ro"]) == 3


CASES = {
    "fixed_step": dict(lr=1e-3, max_iter=10),
    "strong_wolfe": dict(line_search_fn="strong_wolfe", max_iter=10),
    "strong_wolfe_short_history": dict(line_search_fn="strong_wolfe", max_iter=8, history_size=2),
    "tolerances": dict(line_search_fn="strong_wolfe", tolerance_grad=1e-3, tolerance_change=1e-4),
}


@pytest.mark.parametrize("name", CASES)
def test_steps_match_torch(name):
    torch = pytest.importorskip("torch")
    history, optimizer = _run(4, **CASES[name])
    theirs = torch.tensor(START, requires_grad=True)
    theirs_optimizer = torch.optim.LBFGS([theirs], **CASES[name])

    def closure():
        theirs_optimizer.zero_grad()
        loss = _rosenbrock(torch, theirs)
        loss.backward()
        return loss
    for step, got in enumerate(history):
        theirs_optimizer.step(closure)
        np.testing.assert_allclose(got, theirs.detach().numpy(), rtol=1e-9, atol=1e-12, err_msg=f"step {step}")
    ours_state = next(iter(optimizer.state.values()))
    theirs_state = theirs_optimizer.state[theirs]
    assert (ours_state["func_evals"], ours_state["n_iter"]) == (theirs_state["func_evals"], theirs_state["n_iter"])


def test_cubic_interpolation_finds_the_minimum_of_a_cubic():
    # f(x) = x**3 - 3x has its local minimum at x = 1; f' = 3x**2 - 3.
    def f(x):
        return x ** 3 - 3 * x

    def df(x):
        return 3 * x ** 2 - 3
    assert _cubic_interpolate(0.0, f(0.0), df(0.0), 2.0, f(2.0), df(2.0)) == pytest.approx(1.0)


def test_parameter_groups_are_refused():
    with pytest.raises(ValueError, match="LBFGS doesn't support per-parameter options"):
        optim.LBFGS([{"params": [nn.Parameter(tg.ones(1))]}, {"params": [nn.Parameter(tg.ones(1))]}])


def test_unknown_line_search_is_refused():
    p = nn.Parameter(tg.tensor(START))
    optimizer = optim.LBFGS([p], line_search_fn="backtracking")
    with pytest.raises(RuntimeError, match="only 'strong_wolfe' is supported"):
        optimizer.step(_closure(optimizer, p))
