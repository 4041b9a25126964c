"""`gradcheck` and `gradgradcheck`: compare analytical gradients with float64 central
differences, for users' functions as for the test suite."""

from __future__ import annotations

import numpy as np

from tracegrad.autograd.engine import grad as autograd_grad
from tracegrad.grad_mode import enable_grad, no_grad
from tracegrad.tensor import Tensor


class GradcheckError(RuntimeError):
    pass


def _outputs(fn, inputs) -> list[Tensor]:
    out = fn(*inputs)
    return [out] if isinstance(out, Tensor) else [o for o in out if isinstance(o, Tensor)]


def _numerical_jacobian(fn, inputs, index, output_index, eps):
    x = inputs[index]
    # Index the tensor's own buffer (reshape(-1) would copy a non-contiguous one), in
    # C order to match the analytical Jacobian's columns.
    array = x._data
    with no_grad():
        columns = []
        for index in np.ndindex(array.shape):
            original = array[index]
            array[index] = original + eps
            plus = _outputs(fn, inputs)[output_index]._data.astype(np.float64).reshape(-1).copy()
            array[index] = original - eps
            minus = _outputs(fn, inputs)[output_index]._data.astype(np.float64).reshape(-1).copy()
            array[index] = original
            columns.append((plus - minus) / (2 * eps))
        if not columns:  # an empty input: a Jacobian of no columns, one row per output element
            return np.zeros((_outputs(fn, inputs)[output_index].numel(), 0))
    return np.stack(columns, axis=1)


def _analytical_jacobian(fn, inputs, index, output_index):
    with enable_grad():
        out = _outputs(fn, inputs)[output_index]
    rows = []
    n = out.numel()
    for k in range(n):
        seed = np.zeros(n, dtype=out.dtype.np)
        seed[k] = 1
        seed_t = Tensor._make(seed.reshape(out.shape), out._type)
        if not out._requires_grad:
            rows.append(np.zeros(inputs[index].numel()))
            continue
        (g,) = autograd_grad(out, inputs[index], seed_t, retain_graph=True, allow_unused=True,
                             materialize_grads=True)
        rows.append(g._data.astype(np.float64).reshape(-1))
    return np.stack(rows, axis=0) if rows else np.zeros((0, inputs[index].numel()))


def gradcheck(func, inputs, *, eps: float = 1e-6, atol: float = 1e-5, rtol: float = 1e-3,
              raise_exception: bool = True, **_ignored) -> bool:
    """True when d func / d inputs matches central differences for every differentiable input."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    for i, x in enumerate(inputs):
        if isinstance(x, Tensor) and x._requires_grad and x.dtype.name != "float64":
            msg = (f"gradcheck: input {i} is {x.dtype.name}; gradcheck needs float64 inputs "
                   "for meaningful finite differences")
            if raise_exception:
                raise GradcheckError(msg)
            return False
    n_outputs = len(_outputs(fn_nograd(func), inputs))
    for i, x in enumerate(inputs):
        if not (isinstance(x, Tensor) and x._requires_grad):
            continue
        for o in range(n_outputs):
            numerical = _numerical_jacobian(func, inputs, i, o, eps)
            analytical = _analytical_jacobian(func, inputs, i, o)
            if numerical.shape != analytical.shape or not np.allclose(analytical, numerical,
                                                                      rtol=rtol, atol=atol):
                msg = (f"Jacobian mismatch for output {o} with respect to input {i},\n"
                       f"numerical:{numerical}\nanalytical:{analytical}\n")
                if raise_exception:
                    raise GradcheckError(msg)
                return False
    return True


def fn_nograd(func):
    def run(*inputs):
        with no_grad():
            return func(*inputs)
    return run


def gradgradcheck(func, inputs, grad_outputs=None, *, eps: float = 1e-6, atol: float = 1e-5,
                  rtol: float = 1e-3, raise_exception: bool = True, **_ignored) -> bool:
    """gradcheck of the function (inputs, grad_outputs) -> vector-Jacobian products."""
    inputs = tuple(inputs) if isinstance(inputs, (tuple, list)) else (inputs,)
    with no_grad():
        outputs = _outputs(func, inputs)
    if grad_outputs is None:
        rng = np.random.default_rng(0)
        grad_outputs = tuple(Tensor(rng.standard_normal(o.shape), requires_grad=True)
                             for o in outputs if o.dtype.is_floating)
    grad_outputs = tuple(grad_outputs)
    diff_positions = [i for i, x in enumerate(inputs) if isinstance(x, Tensor) and x._requires_grad]

    def first_order(*args):
        xs, seeds = args[:len(inputs)], args[len(inputs):]
        # The first-order gradients must be recorded even while the numerical Jacobian
        # evaluates this function under no_grad.
        with enable_grad():
            outs = [o for o in _outputs(func, xs) if o.dtype.is_floating]
            pairs = [(o, s) for o, s in zip(outs, seeds) if o._requires_grad]
            grads = autograd_grad([o for o, _ in pairs], [xs[i] for i in diff_positions],
                                  [s for _, s in pairs], create_graph=True, allow_unused=True,
                                  materialize_grads=True)
        return tuple(grads)

    return gradcheck(first_order, inputs + grad_outputs, eps=eps, atol=atol, rtol=rtol,
                     raise_exception=raise_exception)
