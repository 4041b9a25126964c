"""User-facing functions (`tg.add`, `tg.softmax`, ...): composites of the primitives in
`tracegrad.ops`, with PyTorch signatures, broadcasting and dtype promotion. Nothing here
has gradient code of its own. The elementwise functions whose primitive entry names a
calling convention are generated (`arith.GENERATED`) and exported here too."""

from types import ModuleType as _ModuleType

from tracegrad.functional.arith import (  # noqa: F401
    GENERATED, add, clamp, clip, div, isinf, isnan, logical_not, mul, pow, relu, rsqrt, sub, to_dtype,
    where,
)
from tracegrad.functional.conv import avg_pool2d, conv2d, max_pool2d  # noqa: F401
from tracegrad.functional.counting import bincount, count_nonzero, histc, nonzero, unique  # noqa: F401
from tracegrad.functional.elementwise_math import (  # noqa: F401
    addcdiv, addcmul, allclose, arctan2, clamp_max, clamp_min, deg2rad, equal, float_power, frac, heaviside,
    isclose, isfinite, isneginf, isposinf, lerp, logaddexp, logaddexp2, logit, nan_to_num, negative, polygamma,
    positive, rad2deg, sgn, signbit, sinc, true_divide, xlogy,
)
from tracegrad.functional.diagonals import (  # noqa: F401
    diag, diag_embed, diagonal, trace, tril_indices, triu_indices,
)
from tracegrad.functional.contract import einsum, tensordot  # noqa: F401
from tracegrad.functional.dtype_info import can_cast, finfo, iinfo, promote_types, result_type  # noqa: F401
from tracegrad.functional.index import gather, getitem, index_put, index_put_by_key  # noqa: F401
from tracegrad.functional.linalg import addmm, bmm, dot, matmul, mm, mv, outer  # noqa: F401
from tracegrad.functional.masking import masked_fill, tril, triu  # noqa: F401
from tracegrad.functional.norms import cdist, dist, norm, renorm  # noqa: F401
from tracegrad.functional.pieces import chunk, flip, narrow, split, unbind  # noqa: F401
from tracegrad.functional.aliases import (  # noqa: F401
    absolute, aminmax, arccos, arccosh, arcsin, arcsinh, arctan, arctanh, argwhere, concatenate, diff, divide,
    fliplr, flipud, greater, greater_equal, isin, less, less_equal, logical_xor, multiply, nanmean, nansum,
    not_equal, ravel, rsub, select, std_mean, subtract, var_mean,
)
from tracegrad.functional.sampling import bernoulli, multinomial, normal, poisson  # noqa: F401
from tracegrad.functional.products import (  # noqa: F401
    addbmm, addmv, addr, baddbmm, chain_matmul, cross, kron, matrix_power,
)
from tracegrad.functional.neural import (  # noqa: F401
    cross_entropy, dropout, gelu, layer_norm, linear, log_softmax, lstm_gates, lstm_layer, mse_loss, silu, softmax,
)
from tracegrad.functional.rearrange import (  # noqa: F401
    atleast_1d, atleast_2d, atleast_3d, block_diag, broadcast_shapes, broadcast_tensors, cartesian_prod,
    column_stack, dsplit, dstack, hsplit, hstack, meshgrid, moveaxis, movedim, repeat_interleave, roll, rot90,
    row_stack, swapaxes, swapdims, tensor_split, tile, unflatten, vsplit, vstack,
)
from tracegrad.functional.reduce import (  # noqa: F401
    all, amax, amin, any, argmax, argmin, logsumexp, max, mean, min, std, sum, var,
)
from tracegrad.functional.scan import cummax, cummin, cumprod, cumsum, logcumsumexp, prod  # noqa: F401
from tracegrad.functional.indexed import (  # noqa: F401
    index_add, index_copy, index_fill, index_select, masked_scatter, masked_select, put, scatter, scatter_add,
    scatter_reduce, take, take_along_dim,
)
from tracegrad.functional.shape import (  # noqa: F401
    T, broadcast_to, cat, clone, concat, contiguous, expand, expand_as, flatten, permute,
    reshape, squeeze, stack, t, transpose, unsqueeze, view,
)
from tracegrad.functional.sorting import (  # noqa: F401
    argsort, bucketize, kthvalue, median, msort, searchsorted, sort, topk,
)

from tracegrad.functional import lstm_loop  # noqa: F401,E402 (installs the LSTM layer's native time loop)

globals().update(GENERATED)  # the functions generated from primitive entries (`Primitive.api`)

# Everything public but the submodules themselves (and the generated table).
__all__ = [name for name, value in dict(globals()).items()
           if not name.startswith("_") and name != "GENERATED" and not isinstance(value, _ModuleType)]
