"""`tg.nn.functional`: the neural-network composites of `tracegrad.functional` re-exported,
plus the ones only layers use: `batch_norm` (which updates running statistics in place),
`embedding`, `binary_cross_entropy_with_logits`, `one_hot` and `upsample*`. Like every composite they are written
with primitives and tracegrad functions and have no gradient code of their own."""

from __future__ import annotations

import numpy as np

from tracegrad import functional as F
from tracegrad.grad_mode import MODE, no_grad
from tracegrad.ir import types
from tracegrad.ops import indexing
from tracegrad.tensor import Tensor
from tracegrad.functional import (  # noqa: F401
    avg_pool2d, conv2d, cross_entropy, dropout, gelu, layer_norm, linear, log_softmax, max_pool2d,
    mse_loss, sigmoid, silu, softmax, tanh,
)
from tracegrad.functional.attention import multi_head_attention_forward, scaled_dot_product_attention  # noqa: F401
from tracegrad.functional.activations import (  # noqa: F401
    celu, elu, glu, hardsigmoid, hardswish, hardtanh, leaky_relu, logsigmoid, mish, prelu, relu6, selu,
    softmin, softplus, softsign, threshold,
)
from tracegrad.functional.conv_transpose import conv1d, conv_transpose1d, conv_transpose2d  # noqa: F401
from tracegrad.functional.distance import cosine_similarity, normalize, pairwise_distance  # noqa: F401
from tracegrad.functional.dropouts import alpha_dropout, dropout1d, dropout2d, dropout3d  # noqa: F401
from tracegrad.functional.losses import (  # noqa: F401
    binary_cross_entropy, cosine_embedding_loss, gaussian_nll_loss, huber_loss, kl_div, l1_loss,
    margin_ranking_loss, multi_margin_loss, nll_loss, poisson_nll_loss, smooth_l1_loss,
    triplet_margin_loss,
)
from tracegrad.functional._util import in_place_option, refuse_grad
from tracegrad.functional.neural import _reduce_loss
from tracegrad.functional.normalization import (  # noqa: F401
    group_norm, instance_norm, local_response_norm, rms_norm,
)
from tracegrad.functional.padding import pad  # noqa: F401
from tracegrad.functional.pooling import (  # noqa: F401
    adaptive_avg_pool1d, adaptive_avg_pool2d, adaptive_max_pool1d, adaptive_max_pool2d, avg_pool1d,
    max_pool1d,
)
from tracegrad.functional.resample import fold, interpolate, pixel_shuffle, pixel_unshuffle, unfold  # noqa: F401


@in_place_option
def relu(input: Tensor, inplace: bool = False) -> Tensor:
    """max(input, 0); with inplace=True written into `input` (nn.ReLU(inplace=True))."""
    return F.relu(input)


def flatten(input: Tensor, start_dim: int = 1, end_dim: int = -1) -> Tensor:
    return F.flatten(input, start_dim, end_dim)


def batch_norm(input: Tensor, running_mean: Tensor | None, running_var: Tensor | None,
               weight: Tensor | None = None, bias: Tensor | None = None, training: bool = False,
               momentum: float | Tensor = 0.1, eps: float = 1e-5) -> Tensor:
    """Normalize each channel (dim 1) of `input` (N, C, *). In training, with the batch's
    statistics (biased variance), and the running statistics, when given, move towards them
    by `momentum` (unbiased variance) under no_grad; in eval, with the running statistics."""
    if input.ndim < 2:
        raise ValueError(f"batch_norm: expected an input with at least 2 dims (N, C, ...), got "
                         f"{list(input.shape)}")
    channels = input.shape[1]
    axes = (0,) + tuple(range(2, input.ndim))
    stat_shape = (1, channels) + (1,) * (input.ndim - 2)
    for name, stat in (("running_mean", running_mean), ("running_var", running_var),
                       ("weight", weight), ("bias", bias)):
        if stat is not None and stat.shape != (channels,):
            raise RuntimeError(f"batch_norm: expected {name} of shape [{channels}], got "
                               f"{list(stat.shape)}")
    if training or running_mean is None or running_var is None:
        count = input.numel() // channels if channels else 0
        if training and count <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input "
                             f"size {list(input.shape)}")
        mean = F.mean(input, axes, keepdim=True)
        centered = F.sub(input, mean)
        variance = F.mean(F.mul(centered, centered), axes, keepdim=True)
        if training and running_mean is not None and running_var is not None:
            with no_grad():
                batch_mean = F.reshape(mean.detach(), (channels,))
                unbiased = F.mul(F.reshape(variance.detach(), (channels,)), count / (count - 1))
                keep = 1.0 - momentum
                running_mean.copy_(F.add(F.mul(running_mean, keep), F.mul(batch_mean, momentum)))
                running_var.copy_(F.add(F.mul(running_var, keep), F.mul(unbiased, momentum)))
    else:
        mean = F.reshape(running_mean, stat_shape)
        variance = F.reshape(running_var, stat_shape)
        centered = F.sub(input, mean)
    out = F.mul(centered, F.rsqrt(F.add(variance, eps)))
    if weight is not None:
        out = F.mul(out, F.reshape(weight, stat_shape))
    if bias is not None:
        out = F.add(out, F.reshape(bias, stat_shape))
    return out


def embedding(input: Tensor, weight: Tensor, padding_idx: int | None = None) -> Tensor:
    """Rows of `weight` at the int64 indices `input`: output shape input.shape + (dim,).
    The row at `padding_idx` is read as usual but gets no gradient."""
    if not isinstance(input, Tensor) or input.dtype is not types.int64:
        got = input.dtype.name if isinstance(input, Tensor) else type(input).__name__
        raise TypeError(f"embedding: expected indices of dtype int64, got {got}")
    # A negative index raises, as in PyTorch (it does not count rows from the end).
    out = indexing.index(weight, [input], 0, negative=False)
    if padding_idx is None:
        return out
    if padding_idx < 0:
        padding_idx += weight.shape[0]
    keep = F.unsqueeze(F.ne(input, padding_idx), -1)
    return F.where(keep, out, indexing.index(weight.detach(), [input], 0, negative=False))


def binary_cross_entropy_with_logits(input: Tensor, target: Tensor, weight: Tensor | None = None,
                                     reduction: str = "mean",
                                     pos_weight: Tensor | None = None) -> Tensor:
    """-[p * y * log(sigmoid(x)) + (1 - y) * log(1 - sigmoid(x))] from logits x, computed
    stably as max(x, 0) - x * y + log(1 + exp(-|x|)) (p: `pos_weight`, 1 by default)."""
    if target.shape != input.shape:
        raise ValueError(f"Target size ({list(target.shape)}) must be the same as input size "
                         f"({list(input.shape)})")
    refuse_grad("binary_cross_entropy_with_logits", "weight", weight)
    refuse_grad("binary_cross_entropy_with_logits", "pos_weight", pos_weight)
    # maximum splits its gradient at a tie and |x|' = sign(0) = 0, so the gradient at
    # x = 0 is the exact sigmoid(0) - y, not -y (zero-initialized logits start there).
    softplus_of_negative = F.add(F.log(F.add(F.exp(F.neg(F.abs(input))), 1.0)),
                                 F.maximum(F.neg(input), 0.0))  # log(1 + exp(-x))
    if pos_weight is None:
        loss = F.add(F.mul(F.sub(1.0, target), input), softplus_of_negative)
    else:
        log_weight = F.add(F.mul(F.sub(pos_weight, 1.0), target), 1.0)
        loss = F.add(F.mul(F.sub(1.0, target), input), F.mul(log_weight, softplus_of_negative))
    if weight is not None:
        loss = F.mul(loss, weight)
    return _reduce_loss("binary_cross_entropy_with_logits", loss, reduction)


def one_hot(tensor: Tensor, num_classes: int = -1) -> Tensor:
    """int64 (*, num_classes) with a 1 at each entry's class. num_classes=-1 takes the
    largest class + 1, which needs the values: not inside a compiled function."""
    if not isinstance(tensor, Tensor) or tensor.dtype is not types.int64:
        raise RuntimeError("one_hot is only applicable to index tensor of type LongTensor.")
    if MODE.tracer is None and tensor.numel():
        values = tensor.detach().numpy()
        if values.min() < 0:
            raise RuntimeError("Class values must be non-negative.")
        if num_classes != -1 and values.max() >= num_classes:
            raise RuntimeError("Class values must be smaller than num_classes.")
    if num_classes == -1:
        if MODE.tracer is not None:
            raise RuntimeError("one_hot: num_classes=-1 reads the values of the tensor; give "
                               "num_classes inside a compiled function")
        num_classes = int(tensor.detach().numpy().max()) + 1 if tensor.numel() else 0
    if num_classes < 0:
        raise RuntimeError("num_classes should be positive")
    classes = Tensor(np.arange(num_classes, dtype=np.int64))
    return F.to_dtype(F.eq(F.unsqueeze(tensor, -1), classes), types.int64)


def _interpolate_named(mode: str):
    def upsample(input: Tensor, size=None, scale_factor=None) -> Tensor:
        if mode == "bilinear":  # (PyTorch's upsample_bilinear aligns corners)
            return interpolate(input, size, scale_factor, mode, align_corners=True)
        return interpolate(input, size, scale_factor, mode)
    upsample.__name__ = f"upsample_{mode}"
    return upsample


def upsample(input: Tensor, size=None, scale_factor=None, mode: str = "nearest",
             align_corners: bool | None = None) -> Tensor:
    return interpolate(input, size, scale_factor, mode, align_corners)


upsample_nearest = _interpolate_named("nearest")
upsample_bilinear = _interpolate_named("bilinear")


def bilinear(input1: Tensor, input2: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """y_k = x1 . (W_k x2) + b_k: input1 (*, in1), input2 (*, in2), weight (out, in1, in2)."""
    if weight.ndim != 3 or input1.shape[-1:] != weight.shape[1:2] or input2.shape[-1:] != weight.shape[2:]:
        raise RuntimeError(f"bilinear: expected input1 (*, {weight.shape[1] if weight.ndim == 3 else '?'}), "
                           f"input2 (*, {weight.shape[2] if weight.ndim == 3 else '?'}) and a 3-D weight, got "
                           f"{list(input1.shape)}, {list(input2.shape)} and {list(weight.shape)}")
    if input1.shape[:-1] != input2.shape[:-1]:
        raise RuntimeError(f"bilinear: input1 and input2 must have the same leading dims, got "
                           f"{list(input1.shape)} and {list(input2.shape)}")
    out_features, in1, in2 = weight.shape
    # x1 @ W as (*, out * in2), then contracted with x2 over in2.
    mixed = F.matmul(input1, F.reshape(F.permute(weight, (1, 0, 2)), (in1, out_features * in2)))
    mixed = F.reshape(mixed, input1.shape[:-1] + (out_features, in2))
    out = F.sum(F.mul(mixed, F.unsqueeze(input2, -2)), -1)
    return F.add(out, bias) if bias is not None else out
