"""`scaled_dot_product_attention` (exported as `tg.nn.functional.scaled_dot_product_attention`):
softmax(q @ k^T * scale + mask) @ v, written with matmul, masked_fill, softmax and dropout,
so its gradient comes from theirs and the compiler fuses it like any other composite.

`multi_head_attention_forward` (PyTorch's function of the same name: the computation of
`nn.MultiheadAttention`, whose parameters live in `tracegrad.nn.attention`) projects
queries, keys and values per head, applies the masks and projects the heads back."""

from __future__ import annotations

import math
import warnings

import numpy as np

from tracegrad.functional import arith, reduce
from tracegrad.functional.linalg import matmul
from tracegrad.functional.masking import masked_fill
from tracegrad.functional.neural import dropout, linear, softmax
from tracegrad.functional.pieces import chunk
from tracegrad.functional.shape import cat, expand, reshape, squeeze, transpose, unsqueeze
from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
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
    # PyTorch's math path: query and key each scaled by the root of the scale (the query
    # takes a negative scale's sign) before their product, which saves those copies (the
    # caller may then update query and key in place; value is saved as it is).
    root = math.sqrt(abs(factor))
    scores = matmul(arith.mul(query, -root if factor < 0 else root), arith.mul(transpose(key, -2, -1), root))
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


# --- multi-head attention (the computation of nn.MultiheadAttention) --------------------------

def canonical_mask(mask: Tensor | None, mask_name: str, target_type: types.DType,
                   other: Tensor | None = None, other_name: str = "") -> Tensor | None:
    """A mask as an additive float mask: a bool mask's True (masked out) becomes -inf, a
    float mask is kept (PyTorch's `_canonical_mask`). Given the `other` mask applied with it,
    a mask of another dtype warns as PyTorch does (mixing a bool padding mask with a float
    attention mask is deprecated there)."""
    if mask is None:
        return None
    if mask.dtype is not types.bool_ and not mask.dtype.is_floating:
        raise AssertionError(f"only bool and floating types of {mask_name} are supported")
    if other is not None and mask.dtype != other.dtype:
        warnings.warn(f"Support for mismatched {mask_name} and {other_name} is deprecated. "
                      "Use same type for both instead.", stacklevel=3)
    if mask.dtype is types.bool_:
        return masked_fill(ew.full(mask.shape, 0.0, target_type), mask, -math.inf)
    return mask


def _check_mha_shapes(query: Tensor, key: Tensor, value: Tensor, key_padding_mask, attn_mask,
                      num_heads: int) -> bool:
    """PyTorch's `_mha_shape_check`: returns whether the input is batched."""
    if query.ndim == 3:
        if key.ndim != 3 or value.ndim != 3:
            raise AssertionError(f"For batched (3-D) `query`, expected `key` and `value` to be 3-D but "
                                 f"found {key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 2:
            raise AssertionError(f"For batched (3-D) `query`, expected `key_padding_mask` to be `None` or "
                                 f"2-D but found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None and attn_mask.ndim not in (2, 3):
            raise AssertionError(f"For batched (3-D) `query`, expected `attn_mask` to be `None`, 2-D or "
                                 f"3-D but found {attn_mask.ndim}-D tensor instead")
        return True
    if query.ndim == 2:
        if key.ndim != 2 or value.ndim != 2:
            raise AssertionError(f"For unbatched (2-D) `query`, expected `key` and `value` to be 2-D but "
                                 f"found {key.ndim}-D and {value.ndim}-D tensors respectively")
        if key_padding_mask is not None and key_padding_mask.ndim != 1:
            raise AssertionError(f"For unbatched (2-D) `query`, expected `key_padding_mask` to be `None` "
                                 f"or 1-D but found {key_padding_mask.ndim}-D tensor instead")
        if attn_mask is not None:
            if attn_mask.ndim not in (2, 3):
                raise AssertionError(f"For unbatched (2-D) `query`, expected `attn_mask` to be `None`, 2-D "
                                     f"or 3-D but found {attn_mask.ndim}-D tensor instead")
            expected = (num_heads, query.shape[0], key.shape[0])
            if attn_mask.ndim == 3 and attn_mask.shape != expected:
                raise AssertionError(f"Expected `attn_mask` shape to be {expected} but got {attn_mask.shape}")
        return False
    raise AssertionError(f"query should be unbatched 2D or batched 3D tensor but received {query.ndim}-D "
                         "query tensor")


def _append_zero_column(mask: Tensor | None) -> Tensor | None:
    """The mask of one more key that is not masked (PyTorch's pad(mask, (0, 1)))."""
    if mask is None:
        return None
    zeros = ew.full(mask.shape[:-1] + (1,), False if mask.dtype is types.bool_ else 0.0, mask.dtype)
    return cat([mask, zeros], -1)


def _project(query: Tensor, key: Tensor, value: Tensor, embed_dim: int, in_proj_weight, in_proj_bias,
             separate: bool, q_proj_weight, k_proj_weight, v_proj_weight) -> tuple[Tensor, Tensor, Tensor]:
    biases = (None, None, None) if in_proj_bias is None else chunk(in_proj_bias, 3)
    if separate:
        weights = (q_proj_weight, k_proj_weight, v_proj_weight)
    else:
        if query is key and key is value:  # self-attention: one matmul for all three
            return chunk(linear(query, in_proj_weight, in_proj_bias), 3, -1)
        weights = chunk(in_proj_weight, 3)
    return tuple(linear(x, w, b) for x, w, b in zip((query, key, value), weights, biases))


def multi_head_attention_forward(
        query: Tensor, key: Tensor, value: Tensor, embed_dim_to_check: int, num_heads: int,
        in_proj_weight: Tensor | None, in_proj_bias: Tensor | None, bias_k: Tensor | None,
        bias_v: Tensor | None, add_zero_attn: bool, dropout_p: float, out_proj_weight: Tensor,
        out_proj_bias: Tensor | None, training: bool = True, key_padding_mask: Tensor | None = None,
        need_weights: bool = True, attn_mask: Tensor | None = None, use_separate_proj_weight: bool = False,
        q_proj_weight: Tensor | None = None, k_proj_weight: Tensor | None = None,
        v_proj_weight: Tensor | None = None, static_k: Tensor | None = None, static_v: Tensor | None = None,
        average_attn_weights: bool = True, is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
    """PyTorch's `F.multi_head_attention_forward`, sequence-first: query (L, N, E), key
    (S, N, E_k), value (S, N, E_v) (or unbatched without N). Masks: True / -inf = not
    attended; `key_padding_mask` (N, S), `attn_mask` (L, S) or (N * heads, L, S). Returns
    the output (L, N, E) and, with `need_weights`, the attention weights (N, L, S) averaged
    over heads (or (N, heads, L, S))."""
    batched = _check_mha_shapes(query, key, value, key_padding_mask, attn_mask, num_heads)
    if not batched:
        query, key, value = unsqueeze(query, 1), unsqueeze(key, 1), unsqueeze(value, 1)
        if key_padding_mask is not None:
            key_padding_mask = unsqueeze(key_padding_mask, 0)
    target_length, batch, embed_dim = query.shape
    source_length = key.shape[0]
    key_padding_mask = canonical_mask(key_padding_mask, "key_padding_mask", query.dtype, attn_mask, "attn_mask")
    if is_causal and attn_mask is None:
        raise RuntimeError("Need attn_mask if specifying the is_causal hint. You may use the Transformer "
                           "module method `generate_square_subsequent_mask` to create this mask.")
    # is_causal is only a hint that attn_mask is causal: the mask itself is applied.
    attn_mask = canonical_mask(attn_mask, "attn_mask", query.dtype)
    if embed_dim != embed_dim_to_check:
        raise AssertionError(f"was expecting embedding dimension of {embed_dim_to_check}, but got {embed_dim}")
    head_dim = embed_dim // num_heads
    if head_dim * num_heads != embed_dim:
        raise AssertionError(f"embed_dim {embed_dim} not divisible by num_heads {num_heads}")
    if use_separate_proj_weight:
        if key.shape[:2] != value.shape[:2]:
            raise AssertionError(f"key's sequence and batch dims {key.shape[:2]} do not match value's "
                                 f"{value.shape[:2]}")
    elif key.shape != value.shape:
        raise AssertionError(f"key shape {key.shape} does not match value shape {value.shape}")
    q, k, v = _project(query, key, value, embed_dim, in_proj_weight, in_proj_bias, use_separate_proj_weight,
                       q_proj_weight, k_proj_weight, v_proj_weight)
    if attn_mask is not None:
        if attn_mask.ndim == 2:
            if attn_mask.shape != (target_length, source_length):
                raise RuntimeError(f"The shape of the 2D attn_mask is {attn_mask.shape}, but should be "
                                   f"{(target_length, source_length)}.")
            attn_mask = unsqueeze(attn_mask, 0)
        elif attn_mask.ndim == 3:
            expected = (batch * num_heads, target_length, source_length)
            if attn_mask.shape != expected:
                raise RuntimeError(f"The shape of the 3D attn_mask is {attn_mask.shape}, but should be "
                                   f"{expected}.")
        else:
            raise RuntimeError(f"attn_mask's dimension {attn_mask.ndim} is not supported")
    if bias_k is not None and bias_v is not None:
        k = cat([k, expand(bias_k, (1, batch, embed_dim))], 0)
        v = cat([v, expand(bias_v, (1, batch, embed_dim))], 0)
        attn_mask = _append_zero_column(attn_mask)
        key_padding_mask = _append_zero_column(key_padding_mask)
    elif (bias_k is None) != (bias_v is None):
        raise AssertionError("bias_k and bias_v must both be given or both be None")
    # (L, N, E) -> (N * heads, L, head_dim)
    q = transpose(reshape(q, (target_length, batch * num_heads, head_dim)), 0, 1)
    k = static_k if static_k is not None else transpose(reshape(k, (k.shape[0], batch * num_heads, head_dim)), 0, 1)
    v = static_v if static_v is not None else transpose(reshape(v, (v.shape[0], batch * num_heads, head_dim)), 0, 1)
    if add_zero_attn:
        k = cat([k, ew.full((k.shape[0], 1, head_dim), 0.0, k.dtype)], 1)
        v = cat([v, ew.full((v.shape[0], 1, head_dim), 0.0, v.dtype)], 1)
        attn_mask = _append_zero_column(attn_mask)
        key_padding_mask = _append_zero_column(key_padding_mask)
    source_length = k.shape[1]
    if key_padding_mask is not None:
        if key_padding_mask.shape != (batch, source_length):
            raise AssertionError(f"expecting key_padding_mask shape of {(batch, source_length)}, but got "
                                 f"{key_padding_mask.shape}")
        per_head = expand(reshape(key_padding_mask, (batch, 1, 1, source_length)),
                          (batch, num_heads, 1, source_length))
        per_head = reshape(per_head, (batch * num_heads, 1, source_length))
        attn_mask = per_head if attn_mask is None else arith.add(attn_mask, per_head)
    if not training:
        dropout_p = 0.0
    if need_weights:
        scores = matmul(arith.mul(q, math.sqrt(1.0 / head_dim)), transpose(k, -2, -1))
        if attn_mask is not None:
            scores = arith.add(attn_mask, scores)
        weights = softmax(scores, -1)  # (a row with every key masked is NaN here, as in PyTorch)
        if dropout_p > 0.0:
            weights = dropout(weights, dropout_p)
        out = matmul(weights, v)
        weights = reshape(weights, (batch, num_heads, target_length, source_length))
        if average_attn_weights:
            weights = reduce.mean(weights, 1)
    else:
        if attn_mask is not None:
            attn_mask = (unsqueeze(attn_mask, 0) if attn_mask.shape[0] == 1
                         else reshape(attn_mask, (batch, num_heads, -1, source_length)))
        out = scaled_dot_product_attention(reshape(q, (batch, num_heads, target_length, head_dim)),
                                           reshape(k, (batch, num_heads, source_length, head_dim)),
                                           reshape(v, (batch, num_heads, source_length, head_dim)),
                                           attn_mask, dropout_p)
        out = reshape(out, (batch * num_heads, target_length, head_dim))
        weights = None
    # (N * heads, L, head_dim) -> (L, N, E), then the output projection
    out = reshape(transpose(out, 0, 1), (target_length, batch, embed_dim))
    out = linear(out, out_proj_weight, out_proj_bias)
    if not batched:
        out = squeeze(out, 1)
        if weights is not None:
            weights = squeeze(weights, 0)
    return out, weights
