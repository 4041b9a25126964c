"""`conv1d` and the transposed convolutions `conv_transpose1d` / `conv_transpose2d`, all
through `conv2d`.

conv1d is conv2d over a height-1 input. A transposed convolution is the gradient of a
convolution with respect to its input, and equals a plain (stride 1) convolution of the
input spread out by the stride (stride - 1 zeros between elements, a strided `pad_slice`)
and padded by dilation * (kernel - 1) - padding on each side (output_padding more at the
end), with the kernel flipped and its in/out channels swapped within each group."""

from __future__ import annotations

from tracegrad.ir import types
from tracegrad.ops import elementwise as ew
from tracegrad.ops import movement as mv
from tracegrad.tensor import Tensor
from tracegrad.functional import arith
from tracegrad.functional.conv import _pair, conv2d
from tracegrad.functional.pieces import flip


def _single(name: str, value) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 1:
            raise ValueError(f"{name}: expected an int or a 1-tuple, got {tuple(value)!r}")
        value = value[0]
    return int(value)


def _batched(name: str, input: Tensor, spatial: int) -> tuple[Tensor, bool]:
    """`input` with a batch dim (added for an unbatched input) and whether it was batched."""
    if input.ndim == spatial + 2:
        return input, True
    if input.ndim == spatial + 1:
        return mv.reshape(input, (1,) + input.shape), False
    raise RuntimeError(f"{name}: Expected {spatial + 1}D (unbatched) or {spatial + 2}D (batched) input "
                       f"to {name}, but got input of size: {list(input.shape)}")


def conv1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1, padding=0,
           dilation=1, groups: int = 1) -> Tensor:
    """PyTorch's conv1d: input (N, C, L) or (C, L), weight (O, C/groups, k)."""
    x, batched = _batched("conv1d", input, 1)
    if weight.ndim != 3:
        raise RuntimeError(f"conv1d: expected a 3-D weight (out_channels, in_channels/groups, kW), got "
                           f"{list(weight.shape)}")
    if not isinstance(padding, str):
        padding = (0, _single("conv1d", padding))
    out = conv2d(mv.reshape(x, (x.shape[0], x.shape[1], 1, x.shape[2])),
                 mv.reshape(weight, weight.shape[:2] + (1, weight.shape[2])), bias,
                 (1, _single("conv1d", stride)), padding, (1, _single("conv1d", dilation)), groups)
    out = mv.reshape(out, out.shape[:2] + out.shape[3:])
    return out if batched else mv.reshape(out, out.shape[1:])


def conv_transpose2d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,
                     padding=0, output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """PyTorch's conv_transpose2d: input (N, C_in, H, W) or (C_in, H, W), weight
    (C_in, C_out/groups, kh, kw)."""
    x, batched = _batched("conv_transpose2d", input, 2)
    if weight.ndim != 4:
        raise RuntimeError(f"conv_transpose2d: expected a 4-D weight (in_channels, out_channels/groups, "
                           f"kH, kW), got {list(weight.shape)}")
    stride, padding = _pair("conv_transpose2d", stride), _pair("conv_transpose2d", padding)
    output_padding = _pair("conv_transpose2d", output_padding)
    dilation = _pair("conv_transpose2d", dilation)
    in_channels, group_out, kernel_h, kernel_w = weight.shape
    if groups <= 0 or in_channels % groups:
        raise RuntimeError(f"conv_transpose2d: in_channels ({in_channels}) must be divisible by groups "
                           f"({groups})")
    if x.shape[1] != in_channels:
        raise RuntimeError(f"Given transposed=1, weight of size {list(weight.shape)}, expected "
                           f"input{list(input.shape)} to have {in_channels} channels, but got "
                           f"{x.shape[1]} channels instead")
    if min(stride) <= 0 or min(dilation) <= 0 or min(padding) < 0:
        raise RuntimeError("conv_transpose2d: stride and dilation must be positive and padding "
                           "non-negative")
    if any(o >= max(s, d) or o < 0 for o, s, d in zip(output_padding, stride, dilation)):
        raise RuntimeError(f"output padding must be smaller than either stride or dilation, but got "
                           f"output_padding_height: {output_padding[0]} output_padding_width: "
                           f"{output_padding[1]} stride_height: {stride[0]} stride_width: {stride[1]} "
                           f"dilation_height: {dilation[0]} dilation_width: {dilation[1]}")
    dtype = x.dtype if x.dtype is weight.dtype else types.promote(x.dtype, weight.dtype)
    x, weight = ew.convert(x, dtype), ew.convert(weight, dtype)
    kernel = (kernel_h, kernel_w)
    # (before, after) of each spatial dim around the spread input; negative ones crop.
    pads = [(d * (k - 1) - p, d * (k - 1) - p + o)
            for k, d, p, o in zip(kernel, dilation, padding, output_padding)]
    group_in = in_channels // groups
    sizes = tuple((n - 1) * s - 2 * p + d * (k - 1) + o + 1 for n, s, p, d, k, o in
                  zip(x.shape[2:], stride, padding, dilation, kernel, output_padding))
    if min(sizes) < 0 or min(x.shape[2:]) == 0:
        raise RuntimeError(f"conv_transpose2d: the output size {list(sizes)} of input "
                           f"{list(input.shape)} is too small (or the input is empty)")
    if min(sizes) == 0:  # (PyTorch returns an empty result there)
        out = ew.full((x.shape[0], groups * group_out) + sizes, 0.0, dtype)
        return out if batched else mv.reshape(out, out.shape[1:])
    spread = _spread(x, stride, pads)
    # (C_in, C_out/g, kh, kw) -> (C_out, C_in/g, kh, kw), flipped in both spatial dims.
    w = mv.reshape(weight, (groups, group_in, group_out, kernel_h, kernel_w))
    w = mv.reshape(mv.permute(w, (0, 2, 1, 3, 4)), (groups * group_out, group_in, kernel_h, kernel_w))
    out = conv2d(spread, flip(w, (2, 3)), None, 1, 0, dilation, groups)
    if bias is not None:
        if bias.shape != (groups * group_out,):
            raise RuntimeError(f"conv_transpose2d: expected bias of shape [{groups * group_out}], got "
                               f"{list(bias.shape)}")
        out = arith.add(out, mv.reshape(ew.convert(bias, dtype), (groups * group_out, 1, 1)))
    return out if batched else mv.reshape(out, out.shape[1:])


def _spread(x: Tensor, stride: tuple[int, int], pads) -> Tensor:
    """x (N, C, H, W) with stride - 1 zeros between elements and `pads` around it."""
    grow = [(max(before, 0), max(after, 0)) for before, after in pads]
    spatial = tuple((n - 1) * s + 1 + b + a if n else b + a
                    for n, s, (b, a) in zip(x.shape[2:], stride, grow))
    starts = (0, 0) + tuple(b for b, _ in grow)
    stops = x.shape[:2] + tuple(b + (n - 1) * s + 1 if n else b
                                for n, s, (b, _) in zip(x.shape[2:], stride, grow))
    out = mv.pad_slice(x, x.shape[:2] + spatial, starts, stops, (1, 1) + stride)
    crop = [(max(-before, 0), max(-after, 0)) for before, after in pads]
    if any(c for pair in crop for c in pair):
        starts = (0, 0) + tuple(b for b, _ in crop)
        stops = out.shape[:2] + tuple(n - a for n, (_, a) in zip(out.shape[2:], crop))
        out = mv.slice_(out, starts, stops, (1,) * 4)
    return out


def conv_transpose1d(input: Tensor, weight: Tensor, bias: Tensor | None = None, stride=1,
                     padding=0, output_padding=0, groups: int = 1, dilation=1) -> Tensor:
    """PyTorch's conv_transpose1d: input (N, C_in, L) or (C_in, L), weight (C_in, C_out/groups, k)."""
    x, batched = _batched("conv_transpose1d", input, 1)
    if weight.ndim != 3:
        raise RuntimeError(f"conv_transpose1d: expected a 3-D weight (in_channels, out_channels/groups, "
                           f"kW), got {list(weight.shape)}")
    out = conv_transpose2d(mv.reshape(x, x.shape[:2] + (1,) + x.shape[2:]),
                           mv.reshape(weight, weight.shape[:2] + (1,) + weight.shape[2:]), bias,
                           (1, _single("conv_transpose1d", stride)), (0, _single("conv_transpose1d", padding)),
                           (0, _single("conv_transpose1d", output_padding)), groups,
                           (1, _single("conv_transpose1d", dilation)))
    out = mv.reshape(out, out.shape[:2] + out.shape[3:])
    return out if batched else mv.reshape(out, out.shape[1:])
