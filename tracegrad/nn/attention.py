"""`nn.MultiheadAttention`: the parameters of multi-head attention, named, shaped and
initialized as PyTorch's (a packed `in_proj_weight`, or `q_proj_weight`, `k_proj_weight`,
`v_proj_weight` when keys or values have other sizes; `in_proj_bias`, `out_proj`, `bias_k`,
`bias_v`), so a PyTorch `state_dict` loads. The computation is the composite
`tracegrad.functional.attention.multi_head_attention_forward`."""

from __future__ import annotations

from tracegrad import creation
from tracegrad.device import check_device
from tracegrad.functional import attention
from tracegrad.functional.shape import transpose
from tracegrad.nn import init
from tracegrad.nn.layers import Linear
from tracegrad.nn.module import Module
from tracegrad.nn.parameter import Parameter
from tracegrad.tensor import Tensor


class NonDynamicallyQuantizableLinear(Linear):
    """The class of `out_proj` in PyTorch (a Linear; the name matters to its quantization)."""


def _parameter(shape: tuple[int, ...], dtype) -> Parameter:
    return Parameter(creation.zeros(*shape, dtype=dtype))


class MultiheadAttention(Module):
    """Attention of `num_heads` heads of size embed_dim // num_heads (Vaswani et al., 2017).

    forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
    average_attn_weights=True, is_causal=False) -> (output, weights or None); sequence first
    (L, N, E) unless `batch_first`."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device=None, dtype=None):
        if embed_dim <= 0 or num_heads <= 0:
            raise ValueError(f"embed_dim and num_heads must be greater than 0, got embed_dim={embed_dim} "
                             f"and num_heads={num_heads} instead")
        super().__init__()
        check_device("MultiheadAttention", device)
        self.embed_dim = embed_dim
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.num_heads = num_heads
        self.dropout = dropout
        self.batch_first = batch_first
        self.head_dim = embed_dim // num_heads
        if self.head_dim * num_heads != embed_dim:
            raise AssertionError("embed_dim must be divisible by num_heads")
        if not self._qkv_same_embed_dim:
            self.q_proj_weight = _parameter((embed_dim, embed_dim), dtype)
            self.k_proj_weight = _parameter((embed_dim, self.kdim), dtype)
            self.v_proj_weight = _parameter((embed_dim, self.vdim), dtype)
            self.register_parameter("in_proj_weight", None)
        else:
            self.in_proj_weight = _parameter((3 * embed_dim, embed_dim), dtype)
            self.register_parameter("q_proj_weight", None)
            self.register_parameter("k_proj_weight", None)
            self.register_parameter("v_proj_weight", None)
        if bias:
            self.in_proj_bias = _parameter((3 * embed_dim,), dtype)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = NonDynamicallyQuantizableLinear(embed_dim, embed_dim, bias=bias)
        if dtype is not None:
            self.out_proj.to(dtype)
        if add_bias_kv:
            self.bias_k = _parameter((1, 1, embed_dim), dtype)
            self.bias_v = _parameter((1, 1, embed_dim), dtype)
        else:
            self.bias_k = self.bias_v = None
        self.add_zero_attn = add_zero_attn
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        # As PyTorch: Xavier-uniform projections, zero biases, Xavier-normal bias_k / bias_v
        # (out_proj's weight keeps Linear's initialization).
        if self._qkv_same_embed_dim:
            init.xavier_uniform_(self.in_proj_weight)
        else:
            init.xavier_uniform_(self.q_proj_weight)
            init.xavier_uniform_(self.k_proj_weight)
            init.xavier_uniform_(self.v_proj_weight)
        if self.in_proj_bias is not None:
            init.constant_(self.in_proj_bias, 0.0)
            init.constant_(self.out_proj.bias, 0.0)
        if self.bias_k is not None:
            init.xavier_normal_(self.bias_k)
        if self.bias_v is not None:
            init.xavier_normal_(self.bias_v)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        batched = query.ndim == 3
        if self.batch_first and batched:
            # (keep `query is key` so self-attention projects once)
            if key is value:
                if query is key:
                    query = key = value = transpose(query, 1, 0)
                else:
                    query, key = transpose(query, 1, 0), transpose(key, 1, 0)
                    value = key
            else:
                query, key, value = (transpose(x, 1, 0) for x in (query, key, value))
        out, weights = attention.multi_head_attention_forward(
            query, key, value, self.embed_dim, self.num_heads, self.in_proj_weight, self.in_proj_bias,
            self.bias_k, self.bias_v, self.add_zero_attn, self.dropout, self.out_proj.weight,
            self.out_proj.bias, training=self.training, key_padding_mask=key_padding_mask,
            need_weights=need_weights, attn_mask=attn_mask,
            use_separate_proj_weight=not self._qkv_same_embed_dim, q_proj_weight=self.q_proj_weight,
            k_proj_weight=self.k_proj_weight, v_proj_weight=self.v_proj_weight,
            average_attn_weights=average_attn_weights, is_causal=is_causal)
        if self.batch_first and batched:
            out = transpose(out, 1, 0)
        return out, weights
