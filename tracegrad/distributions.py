"""`tg.distributions`: the distributions reinforcement-learning and VAE programs use,
`Categorical`, `Normal` and `Bernoulli`, with PyTorch's constructors, `sample`,
`rsample` (Normal: reparameterized, differentiable), `log_prob`, `entropy` and moments.

Densities are composites of tensor ops, so `log_prob` and `entropy` differentiate with
respect to the parameters (REINFORCE's `-log_prob * reward`). Samples come from the global
generator (`manual_seed`), not PyTorch's sequence."""

from __future__ import annotations

import math

from tracegrad import functional as F
from tracegrad.creation import tensor
from tracegrad.grad_mode import no_grad
from tracegrad.random import randn
from tracegrad.tensor import Tensor


def _as_tensor(value) -> Tensor:
    return value if isinstance(value, Tensor) else tensor(float(value))


def _shape(sample_shape) -> tuple[int, ...]:
    return tuple(sample_shape) if not isinstance(sample_shape, int) else (sample_shape,)


class Distribution:
    """The base class: `batch_shape`, `event_shape`, and the methods a distribution defines."""

    has_rsample = False

    def __init__(self, batch_shape=(), event_shape=(), validate_args=None):
        self.batch_shape = tuple(batch_shape)
        self.event_shape = tuple(event_shape)

    def sample(self, sample_shape=()) -> Tensor:
        with no_grad():
            return self.rsample(sample_shape)

    def rsample(self, sample_shape=()) -> Tensor:
        raise NotImplementedError(f"{type(self).__name__} has no reparameterized sample (rsample)")

    def log_prob(self, value: Tensor) -> Tensor:
        raise NotImplementedError

    def entropy(self) -> Tensor:
        raise NotImplementedError

    @property
    def stddev(self) -> Tensor:
        return F.sqrt(self.variance)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Categorical(Distribution):
    """Categories 0..K-1 with `probs` (normalized along the last dim) or `logits`."""

    def __init__(self, probs: Tensor | None = None, logits: Tensor | None = None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            if probs.ndim < 1:
                raise ValueError("`probs` parameter must be at least one-dimensional.")
            self.probs = F.div(probs, F.sum(probs, -1, keepdim=True))
            self.logits = F.log(F.clamp(self.probs, min=F.finfo(probs.dtype).tiny))
        else:
            if logits.ndim < 1:
                raise ValueError("`logits` parameter must be at least one-dimensional.")
            self.logits = F.sub(logits, F.logsumexp(logits, -1, keepdim=True))
            self.probs = F.softmax(logits, -1)
        self._num_events = self.probs.shape[-1]
        super().__init__(self.probs.shape[:-1])

    @property
    def param_shape(self) -> tuple[int, ...]:
        return tuple(self.probs.shape)

    @property
    def mean(self) -> Tensor:
        raise NotImplementedError("Categorical has no mean (its support is unordered), as in PyTorch")

    def sample(self, sample_shape=()) -> Tensor:
        shape = _shape(sample_shape)
        count = math.prod(shape)
        rows = F.reshape(self.probs.detach(), (-1, self._num_events))
        draws = F.multinomial(rows, max(count, 1), replacement=True)  # (rows, count)
        draws = F.narrow(draws, 1, 0, count)
        out = F.reshape(F.t(draws), shape + self.batch_shape)
        return out

    def log_prob(self, value: Tensor) -> Tensor:
        value, logits = F.broadcast_tensors(F.unsqueeze(value, -1), self.logits)
        return F.squeeze(F.gather(logits, -1, F.narrow(value, -1, 0, 1)), -1)

    def entropy(self) -> Tensor:
        logits = F.clamp(self.logits, min=F.finfo(self.logits.dtype).min)
        return F.neg(F.sum(F.mul(logits, self.probs), -1))

    def __repr__(self) -> str:
        return f"Categorical(probs: {self.probs.shape})"


class Normal(Distribution):
    """The normal distribution N(loc, scale**2), broadcast over `loc` and `scale`."""

    has_rsample = True

    def __init__(self, loc, scale, validate_args=None):
        loc, scale = _as_tensor(loc), _as_tensor(scale)
        self.loc, self.scale = F.broadcast_tensors(loc, scale)
        super().__init__(self.loc.shape)

    @property
    def mean(self) -> Tensor:
        return self.loc

    @property
    def stddev(self) -> Tensor:
        return self.scale

    @property
    def variance(self) -> Tensor:
        return F.mul(self.scale, self.scale)

    def rsample(self, sample_shape=()) -> Tensor:
        shape = _shape(sample_shape) + tuple(self.loc.shape)
        eps = randn(*shape, dtype=self.loc.dtype)
        return F.add(self.loc, F.mul(eps, self.scale))

    def log_prob(self, value) -> Tensor:
        value = _as_tensor(value)
        z = F.div(F.sub(value, self.loc), self.scale)
        return F.sub(F.sub(F.mul(F.mul(z, z), -0.5), F.log(self.scale)), 0.5 * math.log(2 * math.pi))

    def entropy(self) -> Tensor:
        return F.add(F.log(self.scale), 0.5 + 0.5 * math.log(2 * math.pi))

    def __repr__(self) -> str:
        return f"Normal(loc: {self.loc.shape}, scale: {self.scale.shape})"


class Bernoulli(Distribution):
    """0/1 outcomes with `probs` or `logits`."""

    def __init__(self, probs=None, logits=None, validate_args=None):
        if (probs is None) == (logits is None):
            raise ValueError("Either `probs` or `logits` must be specified, but not both.")
        if probs is not None:
            self.probs = _as_tensor(probs)
            eps = F.finfo(self.probs.dtype).eps
            clamped = F.clamp(self.probs, eps, 1 - eps)
            self.logits = F.sub(F.log(clamped), F.log1p(F.neg(clamped)))
        else:
            self.logits = _as_tensor(logits)
            self.probs = F.sigmoid(self.logits)
        super().__init__(self.probs.shape)

    @property
    def mean(self) -> Tensor:
        return self.probs

    @property
    def variance(self) -> Tensor:
        return F.mul(self.probs, F.sub(1.0, self.probs))

    def sample(self, sample_shape=()) -> Tensor:
        shape = _shape(sample_shape) + tuple(self.probs.shape)
        return F.bernoulli(F.expand(self.probs.detach(), shape))

    def log_prob(self, value) -> Tensor:
        value = _as_tensor(value)
        logits, value = F.broadcast_tensors(self.logits, value)
        # -BCE with logits: value * logits - softplus(logits), stable for large |logits|.
        softplus = F.add(F.relu(logits), F.log1p(F.exp(F.neg(F.abs(logits)))))
        return F.sub(F.mul(value, logits), softplus)

    def entropy(self) -> Tensor:
        softplus = F.add(F.relu(self.logits), F.log1p(F.exp(F.neg(F.abs(self.logits)))))
        return F.sub(softplus, F.mul(self.probs, self.logits))

    def __repr__(self) -> str:
        return f"Bernoulli(probs: {self.probs.shape})"
