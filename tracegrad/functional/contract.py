"""`einsum` (PyTorch's equations: explicit or implicit output, `...`, repeated labels) and
`tensordot`, composed of diagonal views, sums, permutes, reshapes and batched matmuls, so
they differentiate, take second derivatives and compile like any composite.

An equation is reduced left to right: an operand's repeated label becomes its diagonal, a
label no other operand and not the output names is summed at once, and each pair is one
batched matmul: labels both name and a later operand or the output keeps are batch dims,
labels both name and nothing later keeps are contracted (the matmul's inner dim)."""

from __future__ import annotations

from tracegrad.functional._util import normalize_dim, result_dtype
from tracegrad.functional.diagonals import diagonal
from tracegrad.functional.linalg import matmul
from tracegrad.functional.reduce import sum as _sum
from tracegrad.functional.shape import expand, permute, reshape
from tracegrad.ops import elementwise as ew
from tracegrad.tensor import Tensor

_ELLIPSIS = "."  # ellipsis dims are labelled (".", k): the k-th of them counted from the right


def _parse_term(term: str, ndim: int, where: str) -> list:
    """The labels of one operand's (or the output's) subscripts; `ndim` None for the output."""
    if term.count("...") > 1 or term.replace("...", "").count("."):
        raise RuntimeError(f"einsum(): found {term!r} {where}, but an ellipsis must be exactly three dots, "
                           "and at most one")
    before, _, after = term.partition("...")
    for letter in before + after:
        if not letter.isalpha() or not letter.isascii():
            raise RuntimeError(f"einsum(): invalid subscript given at index {term.index(letter)} in the equation "
                               f"string, subscripts must be in [a-zA-Z]; got {letter!r}")
    if "..." not in term:
        if ndim is not None and len(term) != ndim:
            raise RuntimeError(f"einsum(): the number of subscripts in the equation ({len(term)}) does not match "
                               f"the number of dimensions ({ndim}) for operand {where} and no ellipsis was given")
        return list(term)
    if ndim is None:
        return list(before) + ["..."] + list(after)
    spread = ndim - len(before) - len(after)
    if spread < 0:
        raise RuntimeError(f"einsum(): the number of subscripts in the equation ({len(before) + len(after)}) is "
                           f"more than the number of dimensions ({ndim}) for operand {where}")
    return list(before) + [(_ELLIPSIS, k) for k in range(spread - 1, -1, -1)] + list(after)


def _unique_labels(x: Tensor, labels: list) -> tuple[Tensor, list]:
    """`x` with each label repeated within it replaced by its diagonal (moved last)."""
    while len(set(labels)) != len(labels):
        seen = {}
        for i, label in enumerate(labels):
            if label in seen:
                j = seen[label]
                if x.shape[i] != x.shape[j]:
                    raise RuntimeError(f"einsum(): subscript {label} is repeated for operand but the sizes "
                                       f"don't match, {x.shape[j]} != {x.shape[i]}")
                x = diagonal(x, 0, j, i)
                labels = [lab for k, lab in enumerate(labels) if k not in (i, j)] + [label]
                break
            seen[label] = i
    return x, labels


def _sum_labels(x: Tensor, labels: list, drop) -> tuple[Tensor, list]:
    axes = tuple(i for i, label in enumerate(labels) if label in drop)
    if not axes:
        return x, labels
    return _sum(x, axes), [label for label in labels if label not in drop]


def _numel(sizes) -> int:
    n = 1
    for s in sizes:
        n *= s
    return n


def _contract(a: Tensor, la: list, b: Tensor, lb: list, keep: set, sizes: dict) -> tuple[Tensor, list]:
    a, la = _sum_labels(a, la, {lab for lab in la if lab not in lb and lab not in keep})
    b, lb = _sum_labels(b, lb, {lab for lab in lb if lab not in la and lab not in keep})
    batch = [lab for lab in la if lab in lb and lab in keep]
    inner = [lab for lab in la if lab in lb and lab not in keep]
    a_only = [lab for lab in la if lab not in lb]
    b_only = [lab for lab in lb if lab not in la]

    def arrange(x, labels, order):
        x = permute(x, tuple(labels.index(lab) for lab in order))
        return expand(x, tuple(sizes[lab] for lab in order))  # (size-1 dims broadcast, as PyTorch's)

    a = arrange(a, la, batch + a_only + inner)
    b = arrange(b, lb, batch + inner + b_only)
    n_batch, n_inner = _numel(sizes[lab] for lab in batch), _numel(sizes[lab] for lab in inner)
    m, n = _numel(sizes[lab] for lab in a_only), _numel(sizes[lab] for lab in b_only)
    product = matmul(reshape(a, (n_batch, m, n_inner)), reshape(b, (n_batch, n_inner, n)))
    labels = batch + a_only + b_only
    return reshape(product, tuple(sizes[lab] for lab in labels)), labels


def einsum(equation: str, *operands) -> Tensor:
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not operands:
        raise RuntimeError("einsum(): must provide at least one operand")
    equation = equation.replace(" ", "")
    lhs, arrow, rhs = equation.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(operands):
        raise RuntimeError(f"einsum(): {len(terms)} operands were specified in the equation but "
                           f"{len(operands)} were given")
    labelled = [_parse_term(term, x.ndim, str(k)) for k, (term, x) in enumerate(zip(terms, operands))]
    spread = max((sum(1 for lab in labels if isinstance(lab, tuple)) for labels in labelled), default=0)
    ellipsis = [(_ELLIPSIS, k) for k in range(spread - 1, -1, -1)]
    if arrow:
        output = _parse_term(rhs, None, "output")
        if "..." in output:
            at = output.index("...")
            output[at:at + 1] = ellipsis
        letters = [lab for lab in output if not isinstance(lab, tuple)]
        if len(set(letters)) != len(letters):
            raise RuntimeError(f"einsum(): output subscript {next(lab for lab in letters if letters.count(lab) > 1)} "
                               "appears more than once in the output")
        for lab in letters:
            if not any(lab in labels for labels in labelled):
                raise RuntimeError(f"einsum(): output subscript {lab} does not appear in the equation for any "
                                   "input operand")
    else:  # implicit: the ellipsis dims, then the letters named once, in alphabetical order
        counts = {}
        for labels in labelled:
            for lab in labels:
                if not isinstance(lab, tuple):
                    counts[lab] = counts.get(lab, 0) + 1
        output = ellipsis + sorted(lab for lab, n in counts.items() if n == 1)

    dtype = result_dtype(*operands)
    sizes: dict = {}
    tensors = []
    for k, (x, labels) in enumerate(zip(operands, labelled)):
        x, labels = _unique_labels(ew.convert(x, dtype), labels)
        for lab, size in zip(labels, x.shape):
            known = sizes.get(lab, 1)
            if size != 1 and known != 1 and size != known:
                raise RuntimeError(f"einsum(): operands do not broadcast with remapped shapes (original->remapped)"
                                   f": subscript {lab if not isinstance(lab, tuple) else '...'} has size {size} "
                                   f"for operand {k}, which does not broadcast with previously seen size {known}")
            sizes[lab] = max(known, size) if known != 1 else size
        tensors.append((x, labels))

    x, labels = tensors[0]
    for k in range(1, len(tensors)):
        keep = set(output).union(*(set(later) for _, later in tensors[k + 1:]))
        x, labels = _contract(x, labels, tensors[k][0], tensors[k][1], keep, sizes)
    x, labels = _sum_labels(x, labels, {lab for lab in labels if lab not in output})
    x = permute(x, tuple(labels.index(lab) for lab in output))
    return expand(x, tuple(sizes[lab] for lab in output))


def tensordot(a: Tensor, b: Tensor, dims=2, out=None) -> Tensor:
    """Contract the last `dims` dims of `a` with the first `dims` of `b`, or the pairs of
    dims listed (`dims=([1, 0], [0, 1])`)."""
    if isinstance(dims, Tensor):
        dims = dims.tolist()
    if isinstance(dims, int):
        if dims < 0:
            raise RuntimeError(f"tensordot expects dims >= 0, but got dims={dims}")
        if dims > min(a.ndim, b.ndim):
            raise RuntimeError(f"tensordot expects dims < ndim_a or ndim_b, but got dims={dims}")
        dims_a, dims_b = list(range(a.ndim - dims, a.ndim)), list(range(dims))
    else:
        dims_a, dims_b = ([d] if isinstance(d, int) else list(d) for d in dims)
    if len(dims_a) != len(dims_b):
        raise RuntimeError("both dimension lists should have same length")
    dims_a = [normalize_dim("tensordot", d, a.ndim) for d in dims_a]
    dims_b = [normalize_dim("tensordot", d, b.ndim) for d in dims_b]
    for da, db in zip(dims_a, dims_b):
        if a.shape[da] != b.shape[db]:
            raise RuntimeError(f"contracted dimensions need to match, but first has size {a.shape[da]} in dim {da} "
                               f"and second has size {b.shape[db]} in dim {db}")
    free_a = [d for d in range(a.ndim) if d not in dims_a]
    free_b = [d for d in range(b.ndim) if d not in dims_b]
    dtype = result_dtype(a, b)
    inner = _numel(a.shape[d] for d in dims_a)
    left = reshape(permute(ew.convert(a, dtype), tuple(free_a + dims_a)), (_numel(a.shape[d] for d in free_a), inner))
    right = reshape(permute(ew.convert(b, dtype), tuple(dims_b + free_b)), (inner, _numel(b.shape[d] for d in free_b)))
    return reshape(matmul(left, right), tuple(a.shape[d] for d in free_a) + tuple(b.shape[d] for d in free_b))
