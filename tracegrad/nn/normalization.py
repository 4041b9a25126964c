"""Normalization layers: LayerNorm, RMSNorm, GroupNorm, LocalResponseNorm, and
BatchNorm1d/2d and InstanceNorm1d/2d/3d with running statistics kept as buffers
(`running_mean`, `running_var`, `num_batches_tracked`) and updated under no_grad
in training mode, also inside a compiled function (the update becomes a write)."""

from __future__ import annotations

import numpy as np

from tracegrad import creation
from tracegrad.device import check_device
from tracegrad import functional as F
from tracegrad.grad_mode import no_grad
from tracegrad.nn import functional as nnF
from tracegrad.nn import init
from tracegrad.nn.layers import _empty
from tracegrad.nn.module import Module
from tracegrad.tensor import Tensor


class LayerNorm(Module):
    """Normalizes over the last dims `normalized_shape`; weight ones and bias zeros."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device=None, dtype=None):
        super().__init__()
        check_device("LayerNorm", device)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = _empty(*self.normalized_shape, dtype=dtype)
            if bias:
                self.bias = _empty(*self.normalized_shape, dtype=dtype)
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)
        if self.bias is not None:
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return F.layer_norm(input, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class _BatchNorm(Module):
    _expected_dims: tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device=None, dtype=None):
        super().__init__()
        check_device(type(self).__name__, device)
        self.num_features = num_features
        self.eps = eps
        self.momentum = momentum
        self.affine = affine
        self.track_running_stats = track_running_stats
        if affine:
            self.weight = _empty(num_features, dtype=dtype)
            self.bias = _empty(num_features, dtype=dtype)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", creation.zeros(num_features, dtype=dtype))
            self.register_buffer("running_var", creation.ones(num_features, dtype=dtype))
            self.register_buffer("num_batches_tracked", Tensor(np.array(0, np.int64)))
        else:
            self.register_buffer("running_mean", None)
            self.register_buffer("running_var", None)
            self.register_buffer("num_batches_tracked", None)
        self.reset_parameters()

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            with no_grad():
                self.running_mean.zero_()
                self.running_var.fill_(1.0)
                self.num_batches_tracked.zero_()

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def _check_input_dim(self, input: Tensor) -> None:
        if input.ndim not in self._expected_dims:
            expected = " or ".join(f"{d}D" for d in self._expected_dims)
            raise ValueError(f"expected {expected} input (got {input.ndim}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        momentum = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            with no_grad():
                self.num_batches_tracked.add_(1)
            if self.momentum is None:
                # A cumulative average: a tensor, so a compiled step reads the updated count.
                momentum = F.div(1.0, F.to_dtype(self.num_batches_tracked, self.running_mean.dtype))
        # Without running statistics (track_running_stats=False) eval mode normalizes with
        # the batch's too, as PyTorch does.
        use_batch_stats = self.training or self.running_mean is None
        return nnF.batch_norm(input, self.running_mean, self.running_var, self.weight, self.bias,
                              use_batch_stats, momentum, self.eps)

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, "
                f"affine={self.affine}, track_running_stats={self.track_running_stats}")


class BatchNorm1d(_BatchNorm):
    """Batch normalization of (N, C) or (N, C, L) input over the batch (and length)."""

    _expected_dims = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Batch normalization of (N, C, H, W) input over the batch and spatial dims."""

    _expected_dims = (4,)


class GroupNorm(Module):
    """Normalizes (N, C, *) over groups of channels; weight ones and bias zeros (C,)."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None):
        super().__init__()
        check_device("GroupNorm", device)
        if num_groups <= 0 or num_channels % num_groups:
            raise ValueError("num_channels must be divisible by num_groups")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        if affine:
            self.weight = _empty(num_channels, dtype=dtype)
            self.bias = _empty(num_channels, dtype=dtype)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return nnF.group_norm(input, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class _InstanceNorm(_BatchNorm):
    """Per-sample, per-channel normalization; PyTorch's defaults: no affine parameters and no
    running statistics. An unbatched input (one dim fewer) is normalized as a batch of one."""

    _spatial = 1

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = False, track_running_stats: bool = False, device=None, dtype=None):
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device, dtype)

    def _check_input_dim(self, input: Tensor) -> None:
        if input.ndim not in (self._spatial + 1, self._spatial + 2):
            raise ValueError(f"expected {self._spatial + 1}D or {self._spatial + 2}D input (got "
                             f"{input.ndim}D input)")

    def forward(self, input: Tensor) -> Tensor:
        self._check_input_dim(input)
        unbatched = input.ndim == self._spatial + 1
        channel_dim = 0 if unbatched else 1
        if self.affine and input.shape[channel_dim] != self.num_features:
            raise ValueError(f"expected input's size at dim={channel_dim} to match num_features "
                             f"({self.num_features}), but got: {input.shape[channel_dim]}.")
        x = F.unsqueeze(input, 0) if unbatched else input
        use_input_stats = self.training or not self.track_running_stats
        out = nnF.instance_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                                use_input_stats, 0.1 if self.momentum is None else self.momentum, self.eps)
        return F.squeeze(out, 0) if unbatched else out


class InstanceNorm1d(_InstanceNorm):
    """Instance normalization of (N, C, L) or (C, L) input."""

    _spatial = 1


class InstanceNorm2d(_InstanceNorm):
    """Instance normalization of (N, C, H, W) or (C, H, W) input."""

    _spatial = 2


class InstanceNorm3d(_InstanceNorm):
    """Instance normalization of (N, C, D, H, W) or (C, D, H, W) input."""

    _spatial = 3


class RMSNorm(Module):
    """x / sqrt(mean(x^2) + eps) over the last dims `normalized_shape`, times `weight` (ones)."""

    def __init__(self, normalized_shape: int | tuple[int, ...], eps: float | None = None,
                 elementwise_affine: bool = True, device=None, dtype=None):
        super().__init__()
        check_device("RMSNorm", device)
        if isinstance(normalized_shape, int):
            normalized_shape = (normalized_shape,)
        self.normalized_shape = tuple(normalized_shape)
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        if elementwise_affine:
            self.weight = _empty(*self.normalized_shape, dtype=dtype)
        else:
            self.register_parameter("weight", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            init.ones_(self.weight)

    def forward(self, input: Tensor) -> Tensor:
        return nnF.rms_norm(input, self.normalized_shape, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class LocalResponseNorm(Module):
    def __init__(self, size: int, alpha: float = 1e-4, beta: float = 0.75, k: float = 1.0):
        super().__init__()
        self.size, self.alpha, self.beta, self.k = size, alpha, beta, k

    def forward(self, input: Tensor) -> Tensor:
        return nnF.local_response_norm(input, self.size, self.alpha, self.beta, self.k)

    def extra_repr(self) -> str:
        return f"{self.size}, alpha={self.alpha}, beta={self.beta}, k={self.k}"
