"""User-facing functions (`tg.add`, `tg.softmax`, ...): composites of the primitives in
`tracegrad.ops`, with PyTorch signatures, broadcasting and dtype promotion. Nothing here
has gradient code of its own. The elementwise functions whose primitive entry names a
calling convention are generated (`arith.GENERATED`) and exported here too."""

from tracegrad.functional.arith import (  # noqa: F401
    GENERATED, add, clamp, clip, div, isinf, isnan, logical_not, mul, pow, relu, rsqrt, sub, to_dtype,
    where,
)
from tracegrad.functional.conv import avg_pool2d, conv2d, max_pool2d  # noqa: F401
from tracegrad.functional.dtype_info import can_cast, finfo, iinfo, promote_types, result_type  # noqa: F401
from tracegrad.functional.index import gather, getitem, index_put  # noqa: F401
from tracegrad.functional.linalg import addmm, bmm, dot, matmul, mm, mv, outer  # noqa: F401
from tracegrad.functional.masking import masked_fill, tril, triu  # noqa: F401
from tracegrad.functional.pieces import chunk, flip, narrow, split, unbind  # noqa: F401
from tracegrad.functional.neural import (  # noqa: F401
    cross_entropy, dropout, gelu, layer_norm, linear, log_softmax, mse_loss, silu, softmax,
)
from tracegrad.functional.reduce import (  # noqa: F401
    all, amax, amin, any, argmax, argmin, logsumexp, max, mean, min, std, sum, var,
)
from tracegrad.functional.shape import (  # noqa: F401
    T, broadcast_to, cat, clone, concat, contiguous, expand, expand_as, flatten, permute,
    reshape, squeeze, stack, t, transpose, unsqueeze, view,
)

globals().update(GENERATED)  # the functions generated from primitive entries (`Primitive.api`)

__all__ = [name for name in dir() if not name.startswith("_") and name not in {
    "GENERATED", "arith", "conv", "dtype_info", "index", "linalg", "masking", "neural", "pieces", "reduce", "shape"}]
