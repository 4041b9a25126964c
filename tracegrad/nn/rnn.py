"""Recurrent layers: the cells `RNNCell`, `LSTMCell`, `GRUCell` (one time step) and the
multi-layer, optionally bidirectional `RNN`, `LSTM` (with `proj_size`) and `GRU`.

Parameter names, shapes, order and initialization are PyTorch's, so a PyTorch `state_dict`
loads. Everything is a composite of `linear`, `sigmoid`, `tanh`, `chunk`, `stack` and
`where` (no gradient code here): the input projection of a whole sequence is one matmul,
then a Python loop runs the hidden-to-hidden step; under `tg.compile` the loop unrolls
into one program per sequence length. An LSTM layer without projection or packing is
one op instead, eager and traced (`ops/lstm_layer.py`, as PyTorch's fused layer). Packed
sequences (`tracegrad.nn.utils.rnn`) run as padded batches whose finished sequences keep
their state (`_run_direction`'s `alive`).
"""

from __future__ import annotations

import math
import numbers
import warnings

import numpy as np

from tracegrad import creation
from tracegrad import functional as F
from tracegrad.device import check_device
from tracegrad.functional._util import composite
from tracegrad.nn import init
from tracegrad.nn.module import Module
from tracegrad.nn.parameter import Parameter
from tracegrad.nn.utils.rnn import PackedSequence, packed_to_padded, padded_to_packed
from tracegrad.tensor import Tensor

_GATES = {"RNN_TANH": 1, "RNN_RELU": 1, "LSTM": 4, "GRU": 3}


def _parameter(shape: tuple[int, ...], dtype) -> Parameter:
    return Parameter(creation.zeros(*shape, dtype=dtype))


# --- one time step ----------------------------------------------------------------------------
# Each step takes the input's projection `gi` = x @ W_ih^T + b_ih (computed for the whole
# sequence at once by the layers) and the previous state, and returns the new state. A step
# is a composite: a compiled call following an earlier one takes each step whole instead of
# following its ~15 primitives one by one (`jit/composite.py`). (Not `@fused`: eager fusion
# goes by the largest argument, here the weight, while a step's elementwise work is on the
# small gates; fused, W8's eager step took 13% longer.) Eagerly, an LSTM step's elementwise
# part is one op (`F.lstm_gates`, as PyTorch's fused cell): W8's eager step 47 -> 35 ms.

@composite
def _rnn_step(gi: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None, nonlinearity: str) -> Tensor:
    pre = F.add(gi, F.linear(h, w_hh, b_hh))
    return F.tanh(pre) if nonlinearity == "tanh" else F.relu(pre)


@composite
def _lstm_step(gi: Tensor, h: Tensor, c: Tensor, w_hh: Tensor, b_hh: Tensor | None,
               w_hr: Tensor | None = None) -> tuple[Tensor, Tensor]:
    h_next, c_next = F.lstm_gates(F.add(gi, F.linear(h, w_hh, b_hh)), c)
    if w_hr is not None:
        h_next = F.linear(h_next, w_hr)
    return h_next, c_next


@composite
def _gru_step(gi: Tensor, h: Tensor, w_hh: Tensor, b_hh: Tensor | None) -> Tensor:
    gh = F.linear(h, w_hh, b_hh)
    reset_i, update_i, new_i = F.chunk(gi, 3, -1)
    reset_h, update_h, new_h = F.chunk(gh, 3, -1)
    reset = F.sigmoid(F.add(reset_i, reset_h))
    update = F.sigmoid(F.add(update_i, update_h))
    candidate = F.tanh(F.add(new_i, F.mul(reset, new_h)))
    return F.add(candidate, F.mul(update, F.sub(h, candidate)))  # (1 - z) * n + z * h


# --- cells ------------------------------------------------------------------------------------

class RNNCellBase(Module):
    """The parameters of a cell: weight_ih (G*H, in), weight_hh (G*H, H), bias_ih and
    bias_hh (G*H,), all U(-1/sqrt(H), 1/sqrt(H)) as in PyTorch (G gates)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int,
                 device=None, dtype=None):
        super().__init__()
        check_device(type(self).__name__, device)
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.bias = bias
        self.weight_ih = _parameter((num_chunks * hidden_size, input_size), dtype)
        self.weight_hh = _parameter((num_chunks * hidden_size, hidden_size), dtype)
        if bias:
            self.bias_ih = _parameter((num_chunks * hidden_size,), dtype)
            self.bias_hh = _parameter((num_chunks * hidden_size,), dtype)
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            text += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            text += f", nonlinearity={self.nonlinearity}"
        return text

    def _check_cell_input(self, input: Tensor, states: list[tuple[str, Tensor | None]]) -> bool:
        """Check dims and sizes as PyTorch does; returns whether the input is batched."""
        name = type(self).__name__
        if input.ndim not in (1, 2):
            raise ValueError(f"{name}: Expected input to be 1D or 2D, got {input.ndim}D instead")
        for label, state in states:
            if state is not None and state.ndim not in (1, 2):
                raise ValueError(f"{name}: Expected {label} to be 1D or 2D, got {state.ndim}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input has inconsistent input_size: got {input.shape[-1]} expected "
                               f"{self.input_size}")
        for index, (_, state) in enumerate(states):
            if state is None:
                continue
            if state.ndim != input.ndim:
                raise RuntimeError(f"{name}: expected a {input.ndim}D hidden state for a "
                                   f"{input.ndim}D input, got {list(state.shape)}")
            if input.ndim == 2 and state.shape[0] != input.shape[0]:
                raise RuntimeError(f"Input batch size {input.shape[0]} doesn't match hidden{index} "
                                   f"batch size {state.shape[0]}")
            if state.shape[-1] != self.hidden_size:
                raise RuntimeError(f"hidden{index} has inconsistent hidden_size: got "
                                   f"{state.shape[-1]}, expected {self.hidden_size}")
        return input.ndim == 2

    def _zeros(self, input: Tensor) -> Tensor:
        return creation.zeros(input.shape[0], self.hidden_size, dtype=input.dtype)


class RNNCell(RNNCellBase):
    """h' = tanh(x W_ih^T + b_ih + h W_hh^T + b_hh) (or relu)."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device=None, dtype=None):
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        batched = self._check_cell_input(input, [("hidden", hx)])
        if not batched:
            input = F.unsqueeze(input, 0)
            hx = F.unsqueeze(hx, 0) if hx is not None else None
        h = self._zeros(input) if hx is None else hx
        out = _rnn_step(F.linear(input, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh,
                        self.nonlinearity)
        return out if batched else F.squeeze(out, 0)


class LSTMCell(RNNCellBase):
    """(h', c') of one LSTM step; gates i, f, g, o in that order along weight_ih's rows."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input: Tensor, hx: tuple[Tensor, Tensor] | None = None) -> tuple[Tensor, Tensor]:
        h, c = (None, None) if hx is None else hx
        batched = self._check_cell_input(input, [("hx[0]", h), ("hx[1]", c)])
        if not batched:
            input = F.unsqueeze(input, 0)
            h, c = (None, None) if hx is None else (F.unsqueeze(h, 0), F.unsqueeze(c, 0))
        if hx is None:
            h = c = self._zeros(input)
        h, c = _lstm_step(F.linear(input, self.weight_ih, self.bias_ih), h, c, self.weight_hh, self.bias_hh)
        return (h, c) if batched else (F.squeeze(h, 0), F.squeeze(c, 0))


class GRUCell(RNNCellBase):
    """One GRU step; gates r, z, n in that order along weight_ih's rows."""

    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device=None, dtype=None):
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        batched = self._check_cell_input(input, [("hidden", hx)])
        if not batched:
            input = F.unsqueeze(input, 0)
            hx = F.unsqueeze(hx, 0) if hx is not None else None
        h = self._zeros(input) if hx is None else hx
        out = _gru_step(F.linear(input, self.weight_ih, self.bias_ih), h, self.weight_hh, self.bias_hh)
        return out if batched else F.squeeze(out, 0)


# --- multi-layer, bidirectional ----------------------------------------------------------------

def _run_direction(mode: str, gi: Tensor, state: tuple[Tensor, ...], weights: list[Tensor | None],
                   reverse: bool, alive: list[Tensor] | None) -> tuple[Tensor, tuple[Tensor, ...]]:
    """Run one layer in one direction over the projected inputs `gi` (L, N, G) from `state`
    (h,) or (h, c); returns the outputs (L, N, H_out) and the last state. `alive[t]` (N, 1)
    marks the sequences still running at step t (packed input): the others keep their state
    and output zeros, so a reverse pass starts each sequence at its own last element."""
    _, w_hh, _, b_hh, *projection = weights
    if mode == "LSTM" and alive is None and not projection:
        layer = F.lstm_layer(gi, *state, w_hh, b_hh, reverse)  # (one op, as PyTorch's fused layer)
        if layer is not None:
            return layer[0], layer[1:]
    steps = range(gi.shape[0] - 1, -1, -1) if reverse else range(gi.shape[0])
    inputs = F.unbind(gi, 0)
    outputs: list[Tensor] = [None] * gi.shape[0]
    for t in steps:
        if mode == "LSTM":
            new_state = _lstm_step(inputs[t], *state, w_hh, b_hh, *projection)
        elif mode == "GRU":
            new_state = (_gru_step(inputs[t], state[0], w_hh, b_hh),)
        else:
            new_state = (_rnn_step(inputs[t], state[0], w_hh, b_hh, "tanh" if mode == "RNN_TANH" else "relu"),)
        if alive is None:
            state = new_state
            outputs[t] = new_state[0]
        else:
            state = tuple(F.where(alive[t], new, old) for new, old in zip(new_state, state))
            outputs[t] = F.where(alive[t], new_state[0], 0.0)
    return F.stack(outputs, 0), state


class RNNBase(Module):
    """The parameters and the forward of `RNN`, `LSTM` and `GRU` (`mode`: "RNN_TANH",
    "RNN_RELU", "LSTM" or "GRU"), named and ordered as PyTorch's: for each layer k and
    direction, weight_ih_lk, weight_hh_lk, bias_ih_lk, bias_hh_lk, weight_hr_lk (LSTM with
    proj_size), with the suffix `_reverse` for the backward direction."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1,
                 bias: bool = True, batch_first: bool = False, dropout: float = 0.0,
                 bidirectional: bool = False, proj_size: int = 0, device=None, dtype=None):
        super().__init__()
        check_device(mode.split("_")[0], device)
        if (not isinstance(dropout, numbers.Number) or isinstance(dropout, bool)
                or not 0 <= dropout <= 1):
            raise ValueError("dropout should be a number in range [0, 1] representing the "
                             "probability of an element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so "
                          "non-zero dropout expects num_layers greater than 1, but got "
                          f"dropout={dropout} and num_layers={num_layers}", UserWarning, stacklevel=3)
        if not isinstance(hidden_size, int) or isinstance(hidden_size, bool):
            raise TypeError(f"hidden_size should be of type int, got: {type(hidden_size).__name__}")
        if hidden_size <= 0:
            raise ValueError("hidden_size must be greater than zero")
        if num_layers <= 0:
            raise ValueError("num_layers must be greater than zero")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if mode not in _GATES:
            raise ValueError(f"Unrecognized RNN mode: {mode}")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode = mode
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.bias = bias
        self.batch_first = batch_first
        self.dropout = float(dropout)
        self.bidirectional = bidirectional
        self.proj_size = proj_size
        directions = 2 if bidirectional else 1
        gate_size = _GATES[mode] * hidden_size
        real_hidden = proj_size if proj_size > 0 else hidden_size
        self._flat_weights_names: list[str] = []
        self._all_weights: list[list[str]] = []
        for layer in range(num_layers):
            for direction in range(directions):
                layer_input = input_size if layer == 0 else real_hidden * directions
                suffix = "_reverse" if direction == 1 else ""
                shapes = [("weight_ih", (gate_size, layer_input)), ("weight_hh", (gate_size, real_hidden))]
                if bias:
                    shapes += [("bias_ih", (gate_size,)), ("bias_hh", (gate_size,))]
                if proj_size > 0:
                    shapes += [("weight_hr", (proj_size, hidden_size))]
                names = []
                for kind, shape in shapes:
                    name = f"{kind}_l{layer}{suffix}"
                    setattr(self, name, _parameter(shape, dtype))
                    names.append(name)
                self._flat_weights_names.extend(names)
                self._all_weights.append(names)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0.0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """A no-op: PyTorch packs the weights into one cuDNN buffer; there is none here."""

    @property
    def _flat_weights(self) -> list[Parameter]:
        return [getattr(self, name) for name in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        return [[getattr(self, name) for name in names] for names in self._all_weights]

    def extra_repr(self) -> str:
        text = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            text += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            text += f", num_layers={self.num_layers}"
        if self.bias is not True:
            text += f", bias={self.bias}"
        if self.batch_first is not False:
            text += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            text += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            text += f", bidirectional={self.bidirectional}"
        return text

    # --- forward ----------------------------------------------------------------------------

    def _name(self) -> str:
        return "RNN" if self.mode.startswith("RNN") else self.mode

    def _state_sizes(self, batch: int) -> list[tuple[int, ...]]:
        """The expected shapes of h0 (and c0 for an LSTM)."""
        layers = self.num_layers * (2 if self.bidirectional else 1)
        real_hidden = self.proj_size if self.proj_size > 0 else self.hidden_size
        sizes = [(layers, batch, real_hidden)]
        if self.mode == "LSTM":
            sizes.append((layers, batch, self.hidden_size))
        return sizes

    def _check_input(self, input: Tensor) -> None:
        weight = self.weight_ih_l0
        if input.dtype is not weight.dtype:
            raise ValueError(f"input must have the type {weight.dtype}, got type {input.dtype}")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected {self.input_size}, "
                               f"got {input.shape[-1]}")
        if input.shape[0] == 0:
            raise RuntimeError(f"{self._name()}: Expected sequence length to be larger than 0 in RNN")

    def _check_states(self, states: tuple[Tensor, ...], batch: int) -> None:
        for index, (state, expected) in enumerate(zip(states, self._state_sizes(batch))):
            if state.shape != expected:
                which = f"hidden[{index}]" if self.mode == "LSTM" else "hidden"
                raise RuntimeError(f"Expected {which} size {expected}, got {list(state.shape)}")

    def _states(self, hx, batched: bool) -> tuple[Tensor, ...] | None:
        """hx as a tuple of 3-D states (None if not given), with PyTorch's dim checks."""
        if hx is None:
            return None
        states = tuple(hx) if self.mode == "LSTM" else (hx,)
        want = 3 if batched else 2
        if any(state.ndim != want for state in states):
            dims = ", ".join(f"{state.ndim}-D" for state in states)
            kind = "batched 3-D" if batched else "unbatched 2-D"
            which = "hx and cx" if self.mode == "LSTM" else "hx"
            raise RuntimeError(f"For {kind} input, {which} should also be {want}-D but got "
                               f"({dims}) tensor{'s' if len(states) > 1 else ''}")
        return states if batched else tuple(F.unsqueeze(state, 1) for state in states)

    def forward(self, input, hx=None):
        """input (L, N, H_in) ((N, L, H_in) with batch_first, (L, H_in) unbatched, or a
        PackedSequence) and hx (h0 or (h0, c0), zeros when None); returns (output, h_n) or
        (output, (h_n, c_n)) shaped as in PyTorch."""
        packed = input if isinstance(input, PackedSequence) else None
        if packed is not None:
            input, lengths = packed_to_padded(packed)
            batched, alive = True, _alive_masks(lengths)
            states = self._states(hx, True)
            if states is not None and packed.sorted_indices is not None:
                states = tuple(F.getitem(s, (slice(None), packed.sorted_indices)) for s in states)
        else:
            if input.ndim not in (2, 3):
                raise ValueError(f"{self._name()}: Expected input to be 2D or 3D, got {input.ndim}D "
                                 "tensor instead")
            batched, alive = input.ndim == 3, None
            states = self._states(hx, batched)
            if not batched:
                input = F.unsqueeze(input, 1)
            elif self.batch_first:
                input = F.transpose(input, 0, 1)
        self._check_input(input)
        batch = input.shape[1]
        if states is None:
            states = tuple(creation.zeros(*size, dtype=input.dtype) for size in self._state_sizes(batch))
        self._check_states(states, batch)
        output, last = self._layers(input, states, alive)
        if packed is not None:
            output = padded_to_packed(output, packed)
            if packed.unsorted_indices is not None:
                last = tuple(F.getitem(s, (slice(None), packed.unsorted_indices)) for s in last)
        elif not batched:
            output = F.squeeze(output, 1)
            last = tuple(F.squeeze(s, 1) for s in last)
        elif self.batch_first:
            output = F.transpose(output, 0, 1)
        return output, (last if self.mode == "LSTM" else last[0])

    def _layers(self, input: Tensor, states: tuple[Tensor, ...],
                alive: list[Tensor] | None) -> tuple[Tensor, tuple[Tensor, ...]]:
        directions = 2 if self.bidirectional else 1
        per_layer_states = [F.unbind(state, 0) for state in states]
        finals: list[list[Tensor]] = [[] for _ in states]
        layer_input = input
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(directions):
                index = layer * directions + direction
                weights = self.all_weights[index]
                if not self.bias:  # (positions as with bias: w_ih, w_hh, b_ih, b_hh[, w_hr])
                    weights = weights[:2] + [None, None] + weights[2:]
                gi = F.linear(layer_input, weights[0], weights[2])
                start = tuple(state[index] for state in per_layer_states)
                out, last = _run_direction(self.mode, gi, start, weights, direction == 1, alive)
                outputs.append(out)
                for final, value in zip(finals, last):
                    final.append(value)
            layer_input = outputs[0] if directions == 1 else F.cat(outputs, -1)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_input = F.dropout(layer_input, self.dropout, True)
        return layer_input, tuple(F.stack(final, 0) for final in finals)


def _alive_masks(lengths: list[int]) -> list[Tensor]:
    """For each step t, a (N, 1) bool constant: which sequences have an element at t."""
    lengths_array = np.asarray(lengths)
    return [Tensor((lengths_array > t)[:, None]) for t in range(int(lengths_array.max(initial=0)))]


class RNN(RNNBase):
    """Elman RNN, h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh) (or relu), stacked
    `num_layers` deep. Positional arguments as PyTorch's: (input_size, hidden_size,
    num_layers, nonlinearity, bias, batch_first, dropout, bidirectional)."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        if len(args) > 3:
            kwargs["nonlinearity"] = args[3]
            args = args[:3] + args[4:]
        nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if nonlinearity == "tanh":
            mode = "RNN_TANH"
        elif nonlinearity == "relu":
            mode = "RNN_RELU"
        else:
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        super().__init__(mode, *args, **kwargs)
        self.nonlinearity = nonlinearity  # (not in the repr: PyTorch leaves it out)


class LSTM(RNNBase):
    """Long short-term memory, stacked `num_layers` deep; with `proj_size` > 0 each h_t is
    projected by weight_hr (Sak et al., 2014). forward(input, (h0, c0)) returns
    (output, (h_n, c_n))."""

    def __init__(self, *args, **kwargs):
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """Gated recurrent unit, stacked `num_layers` deep (gates r, z, n as in PyTorch)."""

    def __init__(self, *args, **kwargs):
        if "proj_size" in kwargs:
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        super().__init__("GRU", *args, **kwargs)
