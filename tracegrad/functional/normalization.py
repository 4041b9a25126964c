"""Normalizations beyond layer_norm and batch_norm: `group_norm` (over groups of channels),
`instance_norm` (over each sample's channel, with optional running statistics),
`rms_norm` (by the root mean square of the last dims) and `local_response_norm` (by the
squares of neighbouring channels). Composites of reductions and elementwise ops."""

from __future__ import annotations

import numpy as np

from tracegrad.grad_mode import no_grad
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor
from tracegrad.functional import arith, reduce


def _normalized(x: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """(x - mean) / sqrt(var + eps) over `axes` (biased variance), with the mean and variance."""
    mean = reduce.mean(x, axes, keepdim=True)
    centered = ew.sub(x, mv.expand(mean, x.shape))
    variance = reduce.mean(ew.mul(centered, centered), axes, keepdim=True)
    inv_std = arith.rsqrt(ew.add(variance, ew.full((), eps, variance.dtype)))
    return ew.mul(centered, mv.expand(inv_std, x.shape)), mean, variance


def _affine(out: Tensor, weight: Tensor | None, bias: Tensor | None, channels: int) -> Tensor:
    """out * weight + bias with one value per channel (dim 1)."""
    shape = (channels,) + (1,) * (out.ndim - 2)
    if weight is not None:
        out = arith.mul(out, mv.reshape(weight, shape))
    if bias is not None:
        out = arith.add(out, mv.reshape(bias, shape))
    return out


def _check_channel_params(name: str, channels: int, **params) -> None:
    for key, value in params.items():
        if value is not None and value.shape != (channels,):
            raise RuntimeError(f"{name}: expected {key} of shape [{channels}], got {list(value.shape)}")


def group_norm(input: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize (N, C, *) over each group of C / num_groups channels and the other dims."""
    if input.ndim < 2:
        raise RuntimeError(f"Expected at least 2 dimensions for input tensor but received {input.ndim}")
    batch, channels = input.shape[:2]
    if num_groups <= 0 or channels % num_groups:
        raise RuntimeError(f"Expected number of channels in input to be divisible by num_groups, but got "
                           f"input of shape {list(input.shape)} and num_groups={num_groups}")
    _check_channel_params("group_norm", channels, weight=weight, bias=bias)
    grouped = mv.reshape(input, (batch, num_groups, int(np.prod(input.shape[2:], dtype=np.int64))
                                 * (channels // num_groups)))
    out, _, _ = _normalized(grouped, (2,), eps)
    return _affine(mv.reshape(out, input.shape), weight, bias, channels)


def instance_norm(input: Tensor, running_mean: Tensor | None = None, running_var: Tensor | None = None,
                  weight: Tensor | None = None, bias: Tensor | None = None, use_input_stats: bool = True,
                  momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalize (N, C, *) over the spatial dims of each sample and channel. With running
    statistics, each moves towards the batch average of the instances' statistics
    (unbiased variance) by `momentum`; without use_input_stats they normalize instead."""
    if input.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.ndim} dimensions)")
    channels = input.shape[1]
    _check_channel_params("instance_norm", channels, running_mean=running_mean, running_var=running_var,
                          weight=weight, bias=bias)
    axes = tuple(range(2, input.ndim))
    if not use_input_stats:
        if running_mean is None or running_var is None:
            raise RuntimeError("Expected running_mean and running_var to be defined when "
                               "use_input_stats is false")
        shape = (channels,) + (1,) * len(axes)
        centered = arith.sub(input, mv.reshape(running_mean, shape))
        out = arith.mul(centered, arith.rsqrt(arith.add(mv.reshape(running_var, shape), eps)))
        return _affine(out, weight, bias, channels)
    count = int(np.prod(input.shape[2:], dtype=np.int64))
    if count <= 1:
        raise ValueError(f"Expected more than 1 spatial element when training, got input size "
                         f"{list(input.shape)}")
    out, mean, variance = _normalized(input, axes, eps)
    if running_mean is not None and running_var is not None:
        with no_grad():
            batch_mean = reduce.mean(mv.reshape(mean.detach(), mean.shape[:2]), 0)
            batch_var = reduce.mean(mv.reshape(variance.detach(), variance.shape[:2]), 0)
            unbiased = arith.mul(batch_var, count / (count - 1))
            keep = 1.0 - momentum
            running_mean.copy_(arith.add(arith.mul(running_mean, keep), arith.mul(batch_mean, momentum)))
            running_var.copy_(arith.add(arith.mul(running_var, keep), arith.mul(unbiased, momentum)))
    return _affine(out, weight, bias, channels)


def rms_norm(input: Tensor, normalized_shape, weight: Tensor | None = None,
             eps: float | None = None) -> Tensor:
    """x / sqrt(mean(x^2) + eps) over the last dims `normalized_shape`, times weight; eps
    defaults to the machine epsilon of input's dtype."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    normalized_shape = tuple(normalized_shape)
    k = len(normalized_shape)
    if input.shape[input.ndim - k:] != normalized_shape or k > input.ndim:
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input with shape "
                           f"[*{', '.join(map(str, normalized_shape))}], but got input of size"
                           f"{list(input.shape)}")
    if weight is not None and weight.shape != normalized_shape:
        raise RuntimeError(f"rms_norm: expected weight of shape {list(normalized_shape)}, got "
                           f"{list(weight.shape)}")
    if eps is None:
        eps = float(np.finfo(input.dtype.np).eps)
    axes = tuple(range(input.ndim - k, input.ndim))
    mean_square = reduce.mean(ew.mul(input, input), axes, keepdim=True)
    scale = arith.rsqrt(ew.add(mean_square, ew.full((), eps, mean_square.dtype)))
    out = ew.mul(input, mv.expand(scale, input.shape))
    return arith.mul(out, weight) if weight is not None else out


def local_response_norm(input: Tensor, size: int, alpha: float = 1e-4, beta: float = 0.75,
                        k: float = 1.0) -> Tensor:
    """x / (k + alpha * mean of x^2 over `size` neighbouring channels)^beta; the window of
    channel c is [c - size // 2, c + (size - 1) // 2], zero outside the channels."""
    if input.ndim < 3:
        raise ValueError(f"Expected 3D or higher dimensionality input (got {input.ndim} dimensions)")
    if input.numel() == 0:
        return input
    channels = input.shape[1]
    squares = ew.mul(input, input)
    before, after = size // 2, (size - 1) // 2
    padded_shape = (input.shape[0], channels + before + after) + input.shape[2:]
    starts = (0, before) + (0,) * (input.ndim - 2)
    stops = (input.shape[0], before + channels) + input.shape[2:]
    padded = mv.pad_slice(squares, padded_shape, starts, stops, (1,) * input.ndim)
    total = None
    for offset in range(size):
        window_starts = (0, offset) + (0,) * (input.ndim - 2)
        window_stops = (input.shape[0], offset + channels) + input.shape[2:]
        window = mv.slice_(padded, window_starts, window_stops, (1,) * input.ndim)
        total = window if total is None else ew.add(total, window)
    scale = arith.add(arith.mul(total, alpha / size), k)
    return ew.div(input, arith.pow(scale, beta))
