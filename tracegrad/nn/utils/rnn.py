"""`nn.utils.rnn.pad_sequence`: stack variable-length sequences into one padded tensor.
(Packed sequences are not here: tracegrad has no recurrent layers that would consume them.)"""

from __future__ import annotations

from collections.abc import Sequence

from tracegrad import functional as F
from tracegrad.creation import full
from tracegrad.tensor import Tensor


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
            fill = full((gap, *trailing), padding_value, dtype=seq.dtype)
            seq = F.cat([seq, fill] if padding_side == "right" else [fill, seq])
        padded.append(seq)
    return F.stack(padded, 0 if batch_first else 1)
