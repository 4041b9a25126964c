"""Variable-length sequences for the recurrent layers, as `torch.nn.utils.rnn`:
`PackedSequence` (the steps of a batch of sequences sorted by length, time-major, without
padding), `pack_padded_sequence` / `pad_packed_sequence`, `pad_sequence`, `pack_sequence`.

Packing and unpacking are gathers (`getitem` with an index tensor) whose indices come from
the lengths, which are Python data: so they differentiate like any gather. The layers in
`tracegrad.nn.rnn` run a packed batch as a padded one (`packed_to_padded`) and pack their
output again (`padded_to_packed`)."""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence

import numpy as np

from tracegrad import creation
from tracegrad import functional as F
from tracegrad.tensor import Tensor


class PackedSequence(namedtuple("PackedSequence", ["data", "batch_sizes", "sorted_indices", "unsorted_indices"])):
    """`data` (sum of lengths, *): step 0 of every sequence, then step 1 of those that have
    one, ...; `batch_sizes` (int64, one per step): how many sequences have that step;
    `sorted_indices` / `unsorted_indices`: the permutation to length order and back (None
    when the batch came sorted)."""

    def __new__(cls, data: Tensor, batch_sizes: Tensor | None = None, sorted_indices: Tensor | None = None,
                unsorted_indices: Tensor | None = None):
        if unsorted_indices is None and sorted_indices is not None:
            unsorted_indices = _invert(sorted_indices)
        return super().__new__(cls, data, batch_sizes, sorted_indices, unsorted_indices)

    @property
    def is_cuda(self) -> bool:
        return False

    def to(self, *args, **kwargs) -> PackedSequence:
        data = self.data.to(*args, **kwargs)
        return self if data is self.data else self._replace(data=data)

    def double(self) -> PackedSequence:
        return self._replace(data=self.data.double())

    def float(self) -> PackedSequence:
        return self._replace(data=self.data.float())


def _invert(permutation: Tensor) -> Tensor:
    order = np.asarray(permutation.numpy())
    inverse = np.empty_like(order)
    inverse[order] = np.arange(order.size)
    return Tensor(inverse)


def _lengths_list(lengths) -> list[int]:
    values = lengths.tolist() if isinstance(lengths, Tensor) else list(lengths)
    return [int(v) for v in values]


def _packed_rows(batch_sizes: list[int], batch: int) -> np.ndarray:
    """Where each row of the packed data sits in a (T * batch) padded layout."""
    return np.concatenate([t * batch + np.arange(size) for t, size in enumerate(batch_sizes)]
                          or [np.zeros(0, np.int64)]).astype(np.int64)


def _batch_sizes(lengths: list[int]) -> list[int]:
    lengths_array = np.asarray(lengths)
    return [int((lengths_array > t).sum()) for t in range(int(lengths_array.max(initial=0)))]


def pack_padded_sequence(input: Tensor, lengths, batch_first: bool = False,
                         enforce_sorted: bool = True) -> PackedSequence:
    """Pack `input` (T, B, *) ((B, T, *) with batch_first) holding sequences of `lengths`."""
    lengths = _lengths_list(lengths)
    if input.ndim < 2:
        raise RuntimeError(f"pack_padded_sequence: expected input of at least 2 dims (T, B, *), got "
                           f"{list(input.shape)}")
    if batch_first:
        input = F.transpose(input, 0, 1)
    steps, batch = input.shape[0], input.shape[1]
    if len(lengths) != batch:
        raise RuntimeError(f"Expected `len(lengths)` to be equal to batch_size, but got {len(lengths)} "
                           f"(batch_size={batch})")
    if any(length <= 0 for length in lengths):
        raise RuntimeError("Length of all samples has to be greater than 0, but found an element in "
                           "'lengths' that is <= 0")
    if max(lengths, default=0) > steps:
        raise RuntimeError(f"pack_padded_sequence: a length ({max(lengths)}) exceeds the input's "
                           f"sequence length ({steps})")
    if enforce_sorted:
        if any(a < b for a, b in zip(lengths, lengths[1:])):
            raise RuntimeError("`lengths` array must be sorted in decreasing order when `enforce_sorted` "
                               "is True. You can pass `enforce_sorted=False` to pack_padded_sequence "
                               "and/or pack_sequence to sidestep this requirement if you do not need "
                               "ONNX exportability.")
        sorted_indices = None
    else:
        order = np.argsort(-np.asarray(lengths), kind="stable")
        sorted_indices = Tensor(order.astype(np.int64))
        input = F.getitem(input, (slice(None), sorted_indices))
        lengths = [lengths[i] for i in order]
    batch_sizes = _batch_sizes(lengths)
    flat = F.reshape(input, (steps * batch,) + input.shape[2:])
    data = F.getitem(flat, Tensor(_packed_rows(batch_sizes, batch)))
    return PackedSequence(data, Tensor(np.asarray(batch_sizes, np.int64)), sorted_indices)


def packed_to_padded(sequence: PackedSequence, padding_value: float = 0.0,
                     total_length: int | None = None) -> tuple[Tensor, list[int]]:
    """The packed steps as a padded (T, B, *) batch in length order, and the lengths."""
    batch_sizes = _lengths_list(sequence.batch_sizes)
    batch = batch_sizes[0] if batch_sizes else 0
    lengths = [sum(1 for size in batch_sizes if size > b) for b in range(batch)]
    steps = len(batch_sizes) if total_length is None else total_length
    data = sequence.data
    rest = data.shape[1:]
    # Every padded position reads the row after the data: the padding value.
    source = np.full(steps * batch, data.shape[0], np.int64)
    source[_packed_rows(batch_sizes, batch)] = np.arange(data.shape[0])
    padding = creation.full((1,) + rest, padding_value, dtype=data.dtype)
    padded = F.getitem(F.cat([data, padding], 0), Tensor(source))
    return F.reshape(padded, (steps, batch) + rest), lengths


def padded_to_packed(padded: Tensor, like: PackedSequence) -> PackedSequence:
    """A padded (T, B, *) batch in length order packed with `like`'s steps and order."""
    batch_sizes = _lengths_list(like.batch_sizes)
    steps, batch = padded.shape[0], padded.shape[1]
    flat = F.reshape(padded, (steps * batch,) + padded.shape[2:])
    data = F.getitem(flat, Tensor(_packed_rows(batch_sizes, batch)))
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


def pad_packed_sequence(sequence: PackedSequence, batch_first: bool = False, padding_value: float = 0.0,
                        total_length: int | None = None) -> tuple[Tensor, Tensor]:
    """The inverse of pack_padded_sequence: (padded, lengths), in the original batch order."""
    steps = len(_lengths_list(sequence.batch_sizes))
    if total_length is not None and total_length < steps:
        raise ValueError(f"Expected total_length to be at least the length of the longest sequence in "
                         f"input, but got total_length={total_length} and max sequence length being "
                         f"{steps}")
    padded, lengths = packed_to_padded(sequence, padding_value, total_length)
    lengths_tensor = Tensor(np.asarray(lengths, np.int64))
    if sequence.unsorted_indices is not None:
        padded = F.getitem(padded, (slice(None), sequence.unsorted_indices))
        lengths_tensor = F.getitem(lengths_tensor, sequence.unsorted_indices)
    if batch_first:
        padded = F.transpose(padded, 0, 1)
    return padded, lengths_tensor


def pad_sequence(sequences: Tensor | Sequence[Tensor], batch_first: bool = False, padding_value: float = 0.0,
                 padding_side: str = "right") -> Tensor:
    """Sequences of shape (L_i, *) into (B, max L, *) with `batch_first`, else (max L, B, *);
    the gap is `padding_value`, after each sequence (`padding_side="right"`) or before it.
    A composite of `cat` and `stack`, so gradients flow to each sequence."""
    if padding_side not in ("left", "right"):
        raise ValueError(f"Expected padding_side to be one of left or right, but got {padding_side}.")
    sequences = list(sequences)
    if not sequences:
        raise RuntimeError("received an empty list of sequences")
    trailing = sequences[0].shape[1:]
    for seq in sequences:
        if seq.ndim < 1 or seq.shape[1:] != trailing:
            raise RuntimeError(f"pad_sequence: expected every sequence to have shape (L, *{tuple(trailing)}), "
                               f"but got {tuple(seq.shape)}")
    longest = max(seq.shape[0] for seq in sequences)
    padded = []
    for seq in sequences:
        gap = longest - seq.shape[0]
        if gap:
            fill = creation.full((gap, *trailing), padding_value, dtype=seq.dtype)
            seq = F.cat([seq, fill] if padding_side == "right" else [fill, seq])
        padded.append(seq)
    return F.stack(padded, 0 if batch_first else 1)


def pack_sequence(sequences: Sequence[Tensor], enforce_sorted: bool = True) -> PackedSequence:
    """Pack a list of tensors (L_i, *) (pad_sequence, then pack_padded_sequence)."""
    lengths = [seq.shape[0] for seq in sequences]
    return pack_padded_sequence(pad_sequence(sequences), lengths, enforce_sorted=enforce_sorted)


def unpack_sequence(packed_sequences: PackedSequence) -> list[Tensor]:
    """The list of tensors a PackedSequence holds, in the original order."""
    padded, lengths = pad_packed_sequence(packed_sequences, batch_first=True)
    return [F.narrow(row, 0, 0, int(length)) for row, length in zip(F.unbind(padded, 0), lengths.tolist())]


__all__ = ["PackedSequence", "pack_padded_sequence", "pad_packed_sequence", "pad_sequence",
           "pack_sequence", "unpack_sequence"]
