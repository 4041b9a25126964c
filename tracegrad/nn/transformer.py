"""The Transformer of Vaswani et al. (2017) as PyTorch builds it: `TransformerEncoderLayer`,
`TransformerEncoder`, `TransformerDecoderLayer`, `TransformerDecoder` and `Transformer`,
with post- or pre-layer normalization (`norm_first`), the activation as "relu", "gelu" or a
callable, and submodule names as PyTorch's, so a PyTorch `state_dict` loads.

Made of `MultiheadAttention`, `Linear`, `LayerNorm` and `Dropout`; no gradient code.
PyTorch's inference fast path (nested tensors, fused kernels) is not reproduced: it gives
the same values up to rounding, except that it zeroes padded positions of the encoder's
output, which this module computes like any other position."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import numpy as np

from tracegrad import creation
from tracegrad import functional as F
from tracegrad.defaults import get_default_dtype
from tracegrad.device import check_device
from tracegrad.functional.attention import canonical_mask
from tracegrad.nn import init
from tracegrad.nn.attention import MultiheadAttention
from tracegrad.nn.container import ModuleList
from tracegrad.nn.layers import Dropout, Linear
from tracegrad.nn.module import Module
from tracegrad.nn.normalization import LayerNorm
from tracegrad.tensor import Tensor


def _activation(activation: str | Callable) -> Callable:
    if activation == "relu":
        return F.relu
    if activation == "gelu":
        return F.gelu
    if isinstance(activation, str) or not callable(activation):
        raise RuntimeError(f"activation should be relu/gelu, not {activation}")
    return activation


def _clones(module: Module, count: int) -> ModuleList:
    return ModuleList([copy.deepcopy(module) for _ in range(count)])


def _linear(in_features: int, out_features: int, bias: bool, dtype) -> Linear:
    layer = Linear(in_features, out_features, bias=bias)
    return layer if dtype is None else layer.to(dtype)


def _layer_norm(d_model: int, eps: float, bias: bool, dtype) -> LayerNorm:
    norm = LayerNorm(d_model, eps=eps, bias=bias)
    return norm if dtype is None else norm.to(dtype)


def _causal_mask(size: int, dtype) -> Tensor:
    mask = np.triu(np.full((size, size), -math.inf), 1)
    return creation.tensor(mask, dtype=get_default_dtype() if dtype is None else dtype)


class TransformerEncoderLayer(Module):
    """Self-attention then a feed-forward block, each with dropout, a residual connection
    and a LayerNorm (after the residual, or before the block with `norm_first`)."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        check_device("TransformerEncoderLayer", device)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            dtype=dtype)
        self.linear1 = _linear(d_model, dim_feedforward, bias, dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = _linear(dim_feedforward, d_model, bias, dtype)
        self.norm_first = norm_first
        self.norm1 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.norm2 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, src: Tensor, src_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool = False) -> Tensor:
        src_key_padding_mask = canonical_mask(src_key_padding_mask, "src_key_padding_mask", src.dtype,
                                              src_mask, "src_mask")
        src_mask = canonical_mask(src_mask, "src_mask", src.dtype)
        x = src
        if self.norm_first:
            x = F.add(x, self._sa_block(self.norm1(x), src_mask, src_key_padding_mask, is_causal))
            x = F.add(x, self._ff_block(self.norm2(x)))
        else:
            x = self.norm1(F.add(x, self._sa_block(x, src_mask, src_key_padding_mask, is_causal)))
            x = self.norm2(F.add(x, self._ff_block(x)))
        return x

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           need_weights=False, is_causal=is_causal)[0]
        return self.dropout1(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout2(x)


class TransformerDecoderLayer(Module):
    """Self-attention, attention over the encoder's output (`memory`), then a feed-forward
    block; each with dropout, a residual connection and a LayerNorm."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = F.relu, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        check_device("TransformerDecoderLayer", device)
        self.self_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias, batch_first=batch_first,
                                            dtype=dtype)
        self.multihead_attn = MultiheadAttention(d_model, nhead, dropout=dropout, bias=bias,
                                                 batch_first=batch_first, dtype=dtype)
        self.linear1 = _linear(d_model, dim_feedforward, bias, dtype)
        self.dropout = Dropout(dropout)
        self.linear2 = _linear(dim_feedforward, d_model, bias, dtype)
        self.norm_first = norm_first
        self.norm1 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.norm2 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.norm3 = _layer_norm(d_model, layer_norm_eps, bias, dtype)
        self.dropout1 = Dropout(dropout)
        self.dropout2 = Dropout(dropout)
        self.dropout3 = Dropout(dropout)
        self.activation = _activation(activation)

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool = False,
                memory_is_causal: bool = False) -> Tensor:
        x = tgt
        if self.norm_first:
            x = F.add(x, self._sa_block(self.norm1(x), tgt_mask, tgt_key_padding_mask, tgt_is_causal))
            x = F.add(x, self._mha_block(self.norm2(x), memory, memory_mask, memory_key_padding_mask,
                                         memory_is_causal))
            x = F.add(x, self._ff_block(self.norm3(x)))
        else:
            x = self.norm1(F.add(x, self._sa_block(x, tgt_mask, tgt_key_padding_mask, tgt_is_causal)))
            x = self.norm2(F.add(x, self._mha_block(x, memory, memory_mask, memory_key_padding_mask,
                                                    memory_is_causal)))
            x = self.norm3(F.add(x, self._ff_block(x)))
        return x

    def _sa_block(self, x: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.self_attn(x, x, x, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                           is_causal=is_causal, need_weights=False)[0]
        return self.dropout1(x)

    def _mha_block(self, x: Tensor, memory: Tensor, attn_mask, key_padding_mask, is_causal: bool) -> Tensor:
        x = self.multihead_attn(x, memory, memory, attn_mask=attn_mask, key_padding_mask=key_padding_mask,
                                is_causal=is_causal, need_weights=False)[0]
        return self.dropout2(x)

    def _ff_block(self, x: Tensor) -> Tensor:
        x = self.linear2(self.dropout(self.activation(self.linear1(x))))
        return self.dropout3(x)


class TransformerEncoder(Module):
    """`num_layers` copies of `encoder_layer` (deep copies: separate parameters), then `norm`."""

    def __init__(self, encoder_layer: TransformerEncoderLayer, num_layers: int, norm: Module | None = None,
                 enable_nested_tensor: bool = True, mask_check: bool = True):
        super().__init__()
        self.layers = _clones(encoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm
        # Options of PyTorch's nested-tensor fast path, which tracegrad does not take.
        self.enable_nested_tensor = enable_nested_tensor
        self.mask_check = mask_check

    def forward(self, src: Tensor, mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                is_causal: bool | None = None) -> Tensor:
        src_key_padding_mask = canonical_mask(src_key_padding_mask, "src_key_padding_mask", src.dtype,
                                              mask, "mask")
        mask = canonical_mask(mask, "mask", src.dtype)
        # is_causal is a hint that `mask` is causal (PyTorch then may skip reading it); the mask
        # is applied either way here, so an unset hint is not worked out from the mask.
        is_causal = bool(is_causal)
        output = src
        for layer in self.layers:
            output = layer(output, src_mask=mask, is_causal=is_causal, src_key_padding_mask=src_key_padding_mask)
        if self.norm is not None:
            output = self.norm(output)
        return output


class TransformerDecoder(Module):
    """`num_layers` copies of `decoder_layer`, then `norm`."""

    def __init__(self, decoder_layer: TransformerDecoderLayer, num_layers: int, norm: Module | None = None):
        super().__init__()
        self.layers = _clones(decoder_layer, num_layers)
        self.num_layers = num_layers
        self.norm = norm

    def forward(self, tgt: Tensor, memory: Tensor, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, tgt_key_padding_mask: Tensor | None = None,
                memory_key_padding_mask: Tensor | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        tgt_is_causal = bool(tgt_is_causal)  # (a hint only, as the encoder's is_causal)
        output = tgt
        for layer in self.layers:
            output = layer(output, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                           tgt_key_padding_mask=tgt_key_padding_mask,
                           memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                           memory_is_causal=memory_is_causal)
        if self.norm is not None:
            output = self.norm(output)
        return output


class Transformer(Module):
    """An encoder of `num_encoder_layers` and a decoder of `num_decoder_layers` layers, each
    followed by a LayerNorm; every parameter of 2 or more dims Xavier-uniform initialized.
    forward(src, tgt, ...) returns the decoder's output, shaped like `tgt`."""

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048, dropout: float = 0.1,
                 activation: str | Callable = F.relu, custom_encoder: Module | None = None,
                 custom_decoder: Module | None = None, layer_norm_eps: float = 1e-5, batch_first: bool = False,
                 norm_first: bool = False, bias: bool = True, device=None, dtype=None):
        super().__init__()
        check_device("Transformer", device)
        if custom_encoder is not None:
            self.encoder = custom_encoder
        else:
            layer = TransformerEncoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias, dtype=dtype)
            self.encoder = TransformerEncoder(layer, num_encoder_layers,
                                              _layer_norm(d_model, layer_norm_eps, bias, dtype))
        if custom_decoder is not None:
            self.decoder = custom_decoder
        else:
            layer = TransformerDecoderLayer(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                                            batch_first, norm_first, bias, dtype=dtype)
            self.decoder = TransformerDecoder(layer, num_decoder_layers,
                                              _layer_norm(d_model, layer_norm_eps, bias, dtype))
        self._reset_parameters()
        self.d_model = d_model
        self.nhead = nhead
        self.batch_first = batch_first

    def forward(self, src: Tensor, tgt: Tensor, src_mask: Tensor | None = None, tgt_mask: Tensor | None = None,
                memory_mask: Tensor | None = None, src_key_padding_mask: Tensor | None = None,
                tgt_key_padding_mask: Tensor | None = None, memory_key_padding_mask: Tensor | None = None,
                src_is_causal: bool | None = None, tgt_is_causal: bool | None = None,
                memory_is_causal: bool = False) -> Tensor:
        batched = src.ndim == 3
        if not self.batch_first and src.shape[1] != tgt.shape[1] and batched:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if self.batch_first and src.shape[0] != tgt.shape[0] and batched:
            raise RuntimeError("the batch number of src and tgt must be equal")
        if src.shape[-1] != self.d_model or tgt.shape[-1] != self.d_model:
            raise RuntimeError("the feature number of src and tgt must be equal to d_model")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask,
                              is_causal=src_is_causal)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask, tgt_is_causal=tgt_is_causal,
                            memory_is_causal=memory_is_causal)

    @staticmethod
    def generate_square_subsequent_mask(sz: int, device=None, dtype=None) -> Tensor:
        """A float (sz, sz) mask: -inf above the diagonal (a position does not attend to
        later ones), 0 elsewhere."""
        check_device("generate_square_subsequent_mask", device)
        return _causal_mask(sz, dtype)

    def _reset_parameters(self) -> None:
        for p in self.parameters():
            if p.ndim > 1:
                init.xavier_uniform_(p)
