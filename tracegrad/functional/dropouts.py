"""Dropout variants beyond `dropout`: the channel-wise `dropout1d/2d/3d` (one keep/drop
draw per sample and channel, broadcast over the spatial dims) and `alpha_dropout` (which
keeps the mean and variance of SELU activations). Masks are drawn with `tg.rand`, so
`tg.manual_seed` makes them repeatable."""

from __future__ import annotations

import math
import warnings

from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor
from tracegrad.functional import arith
from tracegrad.functional._util import in_place_option

_ALPHA = 1.7580993408473766  # SELU scale * SELU alpha: -_ALPHA is where SELU saturates


def _check_probability(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")


def _keep_mask(shape: tuple[int, ...], p: float, like: Tensor) -> Tensor:
    from tracegrad.random import rand
    return ew.convert(arith.ge(rand(shape, dtype=like.dtype), p), like.dtype)


def _feature_dropout(input: Tensor, p: float, training: bool) -> Tensor:
    """Zero each (N, C) slice of `input` (N, C, *) with probability p; scale the rest by 1/(1-p)."""
    if not training or p == 0.0:
        return input
    mask_shape = input.shape[:2] + (1,) * (input.ndim - 2)
    if p == 1.0:
        out = ew.mul(input, ew.full_like(input, 0.0))
    else:
        mask = mv.expand(_keep_mask(mask_shape, p, input), input.shape)
        out = ew.mul(ew.mul(input, mask), ew.full((), 1.0 / (1.0 - p), input.dtype))
    return out


def _unbatched(input: Tensor, batched: bool, p: float, training: bool) -> Tensor:
    if batched:
        return _feature_dropout(input, p, training)
    out = _feature_dropout(mv.reshape(input, (1,) + input.shape), p, training)
    return mv.reshape(out, input.shape)


@in_place_option
def dropout1d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    _check_probability(p)
    if input.ndim not in (2, 3):
        raise RuntimeError(f"dropout1d: Expected 2D or 3D input, but received a {input.ndim}D input. "
                           "Note that dropout1d exists to provide channel-wise dropout on inputs with 1 "
                           "spatial dimension, a channel dimension, and an optional batch dimension "
                           "(i.e. 2D or 3D inputs).")
    return _unbatched(input, input.ndim == 3, p, training)


def _deprecated_dims(name: str, ndim: int, spatial: int) -> None:
    warnings.warn(f"{name}: Received a {ndim}-D input to {name}, which is deprecated and will result in "
                  f"an error in a future release. To retain the behavior and silence this warning, please "
                  f"use dropout instead. Note that {name} exists to provide channel-wise dropout on inputs "
                  f"with {spatial} spatial dimensions, a channel dimension, and an optional batch "
                  f"dimension (i.e. {spatial + 1}D or {spatial + 2}D inputs).", UserWarning, stacklevel=3)


@in_place_option
def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    """Channel-wise dropout of (N, C, H, W). A 3-D input is taken as (N, C, L), as PyTorch
    still does (with its warning)."""
    _check_probability(p)
    if input.ndim not in (3, 4):
        _deprecated_dims("dropout2d", input.ndim, 2)
    if input.ndim == 3:
        warnings.warn("dropout2d: Received a 3D input to dropout2d and assuming that channel-wise 1D "
                      "dropout behavior is desired - input is interpreted as shape (N, C, L), where C is "
                      "the channel dim. This behavior will change in a future release to interpret the "
                      "input as one without a batch dimension, i.e. shape (C, H, W). To maintain the 1D "
                      "channel-wise dropout behavior, please switch to using dropout1d instead.",
                      UserWarning, stacklevel=2)
    if input.ndim < 2:
        raise RuntimeError(f"dropout2d: Expected at least 2D input, got {input.ndim}D")
    return _feature_dropout(input, p, training)


@in_place_option
def dropout3d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> Tensor:
    _check_probability(p)
    if input.ndim not in (4, 5):
        _deprecated_dims("dropout3d", input.ndim, 3)
    return _unbatched(input, input.ndim == 5, p, training)


@in_place_option
def alpha_dropout(input: Tensor, p: float = 0.5, training: bool = False, inplace: bool = False) -> Tensor:
    """Dropped elements are set to SELU's negative saturation value, then an affine map
    restores the input's mean and variance (for zero-mean, unit-variance inputs)."""
    _check_probability(p)
    if not training or p == 0.0:
        return input
    if p == 1.0:
        out = ew.mul(input, ew.full_like(input, 0.0))
    else:
        keep = _keep_mask(input.shape, p, input)
        # PyTorch's affine map: a (x keep - alpha (1 - keep)) + alpha a p.
        a = 1.0 / math.sqrt((_ALPHA ** 2 * p + 1) * (1 - p))
        shift = ew.add(ew.mul(ew.sub(keep, ew.full((), 1.0, input.dtype)), ew.full((), _ALPHA * a, input.dtype)),
                       ew.full((), _ALPHA * a * p, input.dtype))
        out = ew.add(ew.mul(ew.mul(input, keep), ew.full((), a, input.dtype)), shift)
    return out
