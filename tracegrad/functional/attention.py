"""`scaled_dot_product_attention` (exported as `tg.nn.functional.scaled_dot_product_attention`):
softmax(q @ k^T * scale + mask) @ v, written with matmul, masked_fill, softmax and dropout,
so its gradient comes from theirs and the compiler fuses it like any other composite.

The multi-head projection around it lives in `tracegrad.nn.attention`."""

from __future__ import annotations

import math

import numpy as np

from tracegrad.functional import arith, reduce
from tracegrad.functional.linalg import matmul
from tracegrad.functional.masking import masked_fill
from tracegrad.functional.neural import dropout, softmax
from tracegrad.functional.shape import expand, reshape, transpose, unsqueeze
from tracegrad.ir import types
from tracegrad.tensor import Tensor


def _check(query: Tensor, key: Tensor, value: Tensor, attn_mask, is_causal: bool, enable_gqa: bool) -> None:
    if not (query.dtype is key.dtype is value.dtype):
        raise RuntimeError(f"Expected query, key, and value to have the same dtype, but got "
                           f"query.dtype: {query.dtype.name} key.dtype: {key.dtype.name} and "
                           f"value.dtype: {value.dtype.name} instead.")
    if not query.dtype.is_floating:
        raise RuntimeError(f"scaled_dot_product_attention: expected floating-point query, key and "
                           f"value, got {query.dtype.name}")
    if min(query.ndim, key.ndim, value.ndim) < 2:
        raise RuntimeError(f"scaled_dot_product_attention: expected query, key and value with at "
                           f"least 2 dims (..., L, E), got {list(query.shape)}, {list(key.shape)} "
                           f"and {list(value.shape)}")
    if query.shape[-1] != key.shape[-1] or key.shape[-2] != value.shape[-2]:
        raise RuntimeError(f"scaled_dot_product_attention: query (..., L, E) {list(query.shape)}, key "
                           f"(..., S, E) {list(key.shape)} and value (..., S, Ev) {list(value.shape)} "
                           "do not agree")
    if is_causal and attn_mask is not None:
        raise RuntimeError("_scaled_dot_product_attention: Explicit attn_mask should not be set "
                           "when is_causal=True")
    if attn_mask is not None and not (attn_mask.dtype is types.bool_ or attn_mask.dtype is query.dtype):
        raise RuntimeError(f"Expected attn_mask dtype to be bool or float or to match query dtype, "
                           f"but got attn_mask.dtype: {attn_mask.dtype.name} and query.dtype: "
                           f"{query.dtype.name} instead.")
    if enable_gqa and query.ndim >= 3:
        heads, key_heads = query.shape[-3], key.shape[-3]
        if key_heads == 0 or heads % key_heads or key.shape[-3] != value.shape[-3]:
            raise RuntimeError(f"scaled_dot_product_attention: with enable_gqa the query's heads "
                               f"({heads}) must be a multiple of the key's and value's heads "
                               f"({key.shape[-3]}, {value.shape[-3]})")


def _repeat_heads(x: Tensor, repeats: int) -> Tensor:
    """(..., Hk, S, E) -> (..., Hk * repeats, S, E), each head repeated in place
    (repeat_interleave on dim -3), as grouped-query attention shares a key head."""
    if repeats == 1:
        return x
    shape = x.shape
    grown = expand(unsqueeze(x, -3), shape[:-2] + (repeats,) + shape[-2:])
    return reshape(grown, shape[:-3] + (shape[-3] * repeats,) + shape[-2:])


def _softmax_of_kept(scores: Tensor) -> Tensor:
    """softmax over the last dim, with a row whose every score is masked (-inf) giving
    zeros (PyTorch's CPU kernels do) instead of NaN. The masked rows are set to 0 before the
    softmax too, so their 0/0 does not make the backward NaN."""
    no_key = reduce.all(arith.eq(scores.detach(), -math.inf), -1, keepdim=True)
    weights = softmax(masked_fill(scores, no_key, 0.0), -1)
    return masked_fill(weights, no_key, 0.0)


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Tensor | None = None,
                                 dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None,
                                 enable_gqa: bool = False) -> Tensor:
    """Attention of `query` (..., L, E) over `key` (..., S, E) and `value` (..., S, Ev).

    `attn_mask` broadcasts to (..., L, S): a bool mask says where a query may attend (True),
    a float mask is added to the scores. `is_causal` masks out keys after a query's position
    (top-left aligned, as PyTorch). `scale` defaults to 1/sqrt(E). Dropout is applied to the
    attention weights whenever `dropout_p` > 0 (the caller passes 0 in eval mode)."""
    _check(query, key, value, attn_mask, is_causal, enable_gqa)
    if enable_gqa and query.ndim >= 3:
        key = _repeat_heads(key, query.shape[-3] // key.shape[-3])
        value = _repeat_heads(value, query.shape[-3] // value.shape[-3])
    length, source = query.shape[-2], key.shape[-2]
    factor = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    scores = arith.mul(matmul(query, transpose(key, -2, -1)), factor)
    if is_causal:
        attn_mask = Tensor(np.tril(np.ones((length, source), dtype=bool)))
    if attn_mask is None:
        weights = softmax(scores, -1)
    else:
        if attn_mask.dtype is types.bool_:
            scores = masked_fill(scores, arith.logical_not(attn_mask), -math.inf)
        else:
            scores = arith.add(scores, attn_mask)
        weights = _softmax_of_kept(scores)
    if dropout_p > 0.0:
        weights = dropout(weights, dropout_p)
    return matmul(weights, value)
