"""Sampling with PyTorch's names: `multinomial`, `bernoulli`, `normal`, `poisson`, and the
in-place fills of a tensor with random values (`normal_`, `uniform_`, `random_`,
`exponential_`, `bernoulli_`, `cauchy_`, `log_normal_`, `geometric_`).

Values come from the global NumPy generator (`manual_seed`) or a `tg.Generator`, so a seed
reproduces a run but not PyTorch's sequence. Samples carry no gradient (PyTorch's are
constants to autograd too). An in-place fill writes through `copy_`, so it follows the
in-place rules: refused on a leaf that requires grad, and a version bump for saved tensors.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.random import Generator, numpy_generator
from tracegrad.tensor import Tensor


def _values(tensor: Tensor) -> np.ndarray:
    return np.asarray(tensor.detach().numpy())


def _float_check(name: str, tensor: Tensor) -> None:
    if not tensor.dtype.is_floating:
        raise NotImplementedError(f'"{name}" not implemented for {tensor.dtype.name} tensors '
                                  "(it draws floating-point values)")


def multinomial(input: Tensor, num_samples: int, replacement: bool = False, *,
                generator: Generator | None = None) -> Tensor:
    """Indices drawn from the categories of each row of `input` (1-D or 2-D non-negative
    weights, not necessarily normalized); int64, shape (num_samples,) or (rows, num_samples)."""
    if input.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got a {input.ndim}-D tensor "
                           f"of shape {list(input.shape)}")
    _float_check("multinomial", input)
    weights = _values(input).astype(np.float64).reshape(-1, input.shape[-1])
    categories = weights.shape[1]
    if num_samples <= 0:
        raise RuntimeError(f"multinomial: cannot sample n_sample <= 0 samples (got {num_samples})")
    if not replacement and num_samples > categories:
        raise RuntimeError(f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples without "
                           f"replacement ({num_samples} > {categories})")
    if not np.isfinite(weights).all() or (weights < 0).any():
        raise RuntimeError("multinomial: probability tensor contains either `inf`, `nan` or element < 0")
    totals = weights.sum(axis=1)
    if (totals <= 0).any():
        raise RuntimeError("multinomial: invalid multinomial distribution (sum of probabilities <= 0)")
    rng = numpy_generator(generator)
    if replacement:
        cumulative = np.cumsum(weights / totals[:, None], axis=1)
        draws = rng.random((weights.shape[0], num_samples))
        out = np.stack([np.searchsorted(row, d, side="right") for row, d in zip(cumulative, draws)])
        out = np.minimum(out, categories - 1)
    else:
        # Exponential races (what PyTorch does): category i wins at time E_i / w_i; the first
        # `num_samples` finishers are a sample without replacement, zero weights finish last.
        with np.errstate(divide="ignore"):
            times = rng.exponential(size=weights.shape) / weights
        out = np.argsort(times, axis=1, kind="stable")[:, :num_samples]
    return Tensor(out.reshape(input.shape[:-1] + (num_samples,)).astype(np.int64))


def bernoulli(input: Tensor, p: float | None = None, *, generator: Generator | None = None) -> Tensor:
    """1 with probability `input` (or `p`) elementwise, else 0, in input's dtype."""
    _float_check("bernoulli", input)
    probabilities = _values(input) if p is None else np.full(input.shape, float(p))
    if ((probabilities < 0) | (probabilities > 1) | np.isnan(probabilities)).any():
        raise RuntimeError("bernoulli: expected all probabilities to be in [0, 1]")
    draws = numpy_generator(generator).random(input.shape) < probabilities
    return Tensor(draws.astype(input.dtype.np))


def normal(mean, std=1.0, size=None, *, generator: Generator | None = None, dtype=None) -> Tensor:
    """Normal samples: a tensor of means and/or of standard deviations (broadcast), or two
    numbers and a `size`."""
    rng = numpy_generator(generator)
    if not isinstance(mean, Tensor) and not isinstance(std, Tensor):
        if size is None:
            raise TypeError("normal: with a number mean and std, give size=")
        dtype = dtype or types.default_float
        shape = tuple(size)
        if std < 0:
            raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
        return Tensor(rng.normal(float(mean), float(std), shape).astype(dtype.np))
    like = mean if isinstance(mean, Tensor) else std
    _float_check("normal", like)
    means = _values(mean) if isinstance(mean, Tensor) else np.float64(mean)
    stds = _values(std) if isinstance(std, Tensor) else np.float64(std)
    if (np.asarray(stds) < 0).any():
        raise RuntimeError("normal expects all elements of std >= 0.0")
    shape = np.broadcast_shapes(np.shape(means), np.shape(stds))
    out = means + stds * rng.standard_normal(shape)
    return Tensor(np.asarray(out, dtype=like.dtype.np))


def poisson(input: Tensor, generator: Generator | None = None) -> Tensor:
    """Poisson samples with rates `input`, in input's dtype."""
    _float_check("poisson", input)
    rates = _values(input)
    if (rates < 0).any() or np.isnan(rates).any():
        raise RuntimeError("poisson: invalid Poisson rate, expected rate to be non-negative")
    return Tensor(numpy_generator(generator).poisson(rates).astype(input.dtype.np))


# --- in-place fills ------------------------------------------------------------------------


def _fill(tensor: Tensor, values: np.ndarray) -> Tensor:
    """Write `values` into `tensor` as an in-place op (copy_'s rules and errors)."""
    return tensor.copy_(Tensor(np.asarray(values, dtype=tensor.dtype.np)))


def _draw_float(name: str, tensor: Tensor, draw) -> Tensor:
    _float_check(name, tensor)
    return _fill(tensor, draw(tensor.shape))


def normal_(self: Tensor, mean: float = 0.0, std: float = 1.0, *, generator: Generator | None = None) -> Tensor:
    if std < 0:
        raise RuntimeError(f"normal_ expects std >= 0.0, but found std {std}")
    return _draw_float("normal_", self, lambda shape: numpy_generator(generator).normal(mean, std, shape))


def uniform_(self: Tensor, from_: float = 0.0, to: float = 1.0, *, generator: Generator | None = None,
             **keywords) -> Tensor:
    from_ = keywords.pop("from", from_)  # PyTorch's keyword is `from`, a Python keyword
    if keywords:
        raise TypeError(f"uniform_() got unexpected keyword arguments {sorted(keywords)}")
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={from_} > to={to}")
    return _draw_float("uniform_", self, lambda shape: numpy_generator(generator).uniform(from_, to, shape))


def exponential_(self: Tensor, lambd: float = 1.0, *, generator: Generator | None = None) -> Tensor:
    if lambd <= 0:
        raise RuntimeError(f"exponential_ expects lambda > 0.0, but found lambda={lambd}")
    return _draw_float("exponential_", self, lambda shape: numpy_generator(generator).exponential(1.0 / lambd, shape))


def cauchy_(self: Tensor, median: float = 0.0, sigma: float = 1.0, *, generator: Generator | None = None) -> Tensor:
    return _draw_float("cauchy_", self,
                       lambda shape: median + sigma * numpy_generator(generator).standard_cauchy(shape))


def log_normal_(self: Tensor, mean: float = 1.0, std: float = 2.0, *, generator: Generator | None = None) -> Tensor:
    return _draw_float("log_normal_", self, lambda shape: numpy_generator(generator).lognormal(mean, std, shape))


def geometric_(self: Tensor, p: float, *, generator: Generator | None = None) -> Tensor:
    if not 0 < p < 1:
        raise RuntimeError(f"geometric_ expects p to be in (0, 1), but got p={p}")
    return _fill(self, numpy_generator(generator).geometric(p, self.shape))


def bernoulli_(self: Tensor, p: float | Tensor = 0.5, *, generator: Generator | None = None) -> Tensor:
    probabilities = _values(p) if isinstance(p, Tensor) else np.float64(p)
    if (np.asarray((probabilities < 0) | (probabilities > 1))).any():
        raise RuntimeError("bernoulli_ expects p to be in [0, 1]")
    return _fill(self, numpy_generator(generator).random(self.shape) < probabilities)


def random_(self: Tensor, from_: int = 0, to: int | None = None, *, generator: Generator | None = None,
            **keywords) -> Tensor:
    """Integers uniform on [from, to - 1]; without `to`, up to the largest integer the dtype
    holds exactly (2**24 for float32, 2**53 for float64, the type's maximum for integers)."""
    from_ = keywords.pop("from", from_)
    if keywords:
        raise TypeError(f"random_() got unexpected keyword arguments {sorted(keywords)}")
    if to is None:
        if from_ != 0 and not isinstance(from_, bool):  # random_(to) is random_(0, to)
            from_, to = 0, from_
        elif self.dtype.is_floating:
            to = 2 ** (np.finfo(self.dtype.np).nmant + 1) + 1
        elif self.dtype is types.bool_:
            to = 2
        else:
            to = int(np.iinfo(self.dtype.np).max)
    if from_ >= to:
        raise RuntimeError(f"random_ expects 'from' to be less than 'to', but got from={from_} >= to={to}")
    return _fill(self, numpy_generator(generator).integers(from_, to, self.shape))


IN_PLACE = {"normal_": normal_, "uniform_": uniform_, "exponential_": exponential_, "cauchy_": cauchy_,
            "log_normal_": log_normal_, "geometric_": geometric_, "bernoulli_": bernoulli_, "random_": random_}

