"""`lstm_layer`: one LSTM layer's whole time loop (one direction) as one eager op, as
PyTorch runs `nn.LSTM` (its fused RNN layer), instead of ~6 recorded ops per time step.

Inputs: the projected inputs of the sequence gi (L, N, 4H) (x_t W_ih^T + b_ih, one product
for the whole sequence, made by the caller), the initial states h0 and c0 (N, H), the
recurrent weight w_hh (4H, H) and bias b_hh (4H). Attribute `reverse`: run from the last
step back (a bidirectional layer's second direction). Each step is what the composite
(`functional.neural.lstm_layer`) records: pre = gi_t + (h W_hh^T + b_hh), then
`lstm_gates(pre, c)`; the implementation calls the same two implementations (the matmul
primitive's and lstm_gates'), so its values are the composite's eager values.

Outputs: a record (L, N, 6H) of each step's pre-activations, cell and hidden state, which
the gradient rule reads (saved as itself: the functional layer drops it, so nobody else
holds it), then the output sequence (L, N, H) and the last states h_n and c_n, each its own
memory as the composite's. The gradient rule is backpropagation through time written with
primitives (the backward cache compiles it; `create_graph` differentiates it again, and
the record's own cotangent, which a second derivative brings, is taken in): the
activations of all steps at once, one (N, 4H) @ (4H, H) product per step for the hidden
state's gradient, and the weight's gradient as one product over all steps.

What it saves matches what the composite saves, so an in-place update fails backward
exactly where the composite's does: h0 (the first product's input, read by the weight's
gradient), c0 (the first step's lstm_gates input, read by everything but its own
gradient) and w_hh (every product's). Sequences shorter than 2 steps take the composite
(its one product saves w_hh only for h0's gradient).

Traces record this op too, unlike the other one-op primitives (`ops/neural.py`): no code
generation of its own, so a compiled program runs this implementation as one step. A
compiled W8 step (2 layers of 35 steps) took 24.9 ms with the composite's ~6 ops per step
traced, fused and followed on every call, 23.1 ms with one op per layer.
"""

from __future__ import annotations

import numpy as np

from tracegrad.ir import types
from tracegrad.ir.passes import constant_of
from tracegrad.ir.primitive import OTHER, Primitive
from tracegrad.ir.types import TensorType
from tracegrad.ops import elementwise as ew
from tracegrad.ops import linalg
from tracegrad.ops import movement as mv
from tracegrad.ops import neural
from tracegrad.ops import reduction as red
from tracegrad.ops.dispatch import bind

GI, H0, C0, W_HH, B_HH = range(5)  # input positions


def _lstm_layer_rule(gi: TensorType, h0: TensorType, c0: TensorType, w_hh: TensorType, b_hh: TensorType,
                     reverse: bool):
    dtype = gi.dtype
    ok = (gi.ndim == 3 and h0.ndim == 2 and h0 == c0 and gi.shape[0] >= 1 and dtype in neural.DTYPES)
    if ok:
        steps, batch, gates = gi.shape
        hidden = h0.shape[1]
        ok = (gates == 4 * hidden and h0.shape[0] == batch and w_hh.shape == (gates, hidden)
              and b_hh.shape == (gates,) and all(t.dtype is dtype for t in (h0, c0, w_hh, b_hh)))
    if not ok:
        raise RuntimeError(f"lstm_layer: expected gi (L, N, 4H) with L >= 1, h0 and c0 (N, H), w_hh (4H, H) and "
                           f"b_hh (4H) of one dtype, float32 or float64; got {gi}, {h0}, {c0}, {w_hh} and {b_hh}")
    return (TensorType((steps, batch, 6 * hidden), dtype), TensorType((steps, batch, hidden), dtype), h0, c0)


# The layer's time loop run natively (`functional/lstm_loop.py`, installed with
# `set_native_loop`): `loop(gi, h0, c0, w_hh, b_hh, reverse)` gives the four outputs, with
# the values of the loop below once its gates run compiled, or None (the loop below runs).
_native_loop = None


def set_native_loop(loop) -> None:
    global _native_loop
    _native_loop = loop


def _lstm_layer_impl(gi, h0, c0, w_hh, b_hh, reverse):
    if _native_loop is not None:
        outputs = _native_loop(gi, h0, c0, w_hh, b_hh, reverse)
        if outputs is not None:
            return outputs
    steps, batch, gates = gi.shape
    hidden = gates // 4
    record = np.empty((steps, batch, 6 * hidden), gi.dtype)
    out = np.empty((steps, batch, hidden), gi.dtype)
    recurrent = linalg.fixed_right_product(w_hh.T)  # (h @ W_hh^T, step after step: B packed once)
    cell = neural.LSTM_GATES.impl  # (its compiled program from a geometry's second call)
    h, c = h0, c0
    for t in (range(steps - 1, -1, -1) if reverse else range(steps)):
        row = record[t]
        pre = row[:, :gates]
        np.add(gi[t], np.add(recurrent(h), b_hh), out=pre)
        h, c = cell(pre, c)
        row[:, gates:gates + hidden] = c
        row[:, gates + hidden:] = h
        out[t] = h
    return record, out, np.array(h, copy=True), np.array(c, copy=True)


def _part(x, lo: int, hi: int):
    """x[..., lo:hi] of a 3-D value."""
    steps, batch, _ = x.shape
    return mv.slice_(x, (0, 0, lo), (steps, batch, hi), (1, 1, 1))


def _step(x, t: int):
    """x[t] of a 3-D value, as (N, C)."""
    steps, batch, width = x.shape
    return mv.reshape(mv.slice_(x, (t, 0, 0), (t + 1, batch, width), (1, 1, 1)), (batch, width))


def _previous(states, first, reverse: bool):
    """Per step, the state the step started from: `first` (N, H) for the first step run,
    else the state the step before it (in run order) ended with."""
    steps, batch, hidden = states.shape
    first = mv.reshape(first, (1, batch, hidden))
    if steps == 1:
        return first
    if reverse:
        return mv.concat([mv.slice_(states, (1, 0, 0), (steps, batch, hidden), (1, 1, 1)), first], 0)
    return mv.concat([first, mv.slice_(states, (0, 0, 0), (steps - 1, batch, hidden), (1, 1, 1))], 0)


def _known_zero(cotangent) -> bool:
    """Whether `cotangent` is zero and carries no gradient of its own: what the engine
    hands for an output nobody read (the record, usually; h_n and c_n of a detached
    state). Adding it would cost a pass per step, for nothing but turning -0 into +0."""
    if cotangent._requires_grad:
        return False
    if cotangent._data is None:
        return constant_of(cotangent._value) == 0
    return not cotangent._data.any()


def _plus(a, b):
    """a + b, either None for zero."""
    return b if a is None else a if b is None else ew.add(a, b)


def _lstm_layer_vjp(ctx, g_record, g_out, g_h, g_c):
    # Forward, per step: i, f, o = sigmoid(pre parts), g = tanh(pre part), c' = f c + i g,
    # h' = o tanh(c'). Backward from the last step run: dh = (gradient from the step
    # after) + g_out[t] + the record's h cotangent; dc likewise plus dh o (1 - tanh(c')^2);
    # the step's pre-activation gradient from dh and dc; then the step before gets
    # dpre W_hh (its h) and dc f (its c).
    _, h0, c0, w_hh, _ = ctx.inputs
    record = ctx.out
    steps, batch, gates = ctx.in_types[GI].shape
    hidden = gates // 4
    dtype = ctx.in_types[GI].dtype
    reverse = ctx.attrs["reverse"]
    needs = ctx.needs_input_grad
    g_record, g_out, g_h, g_c = (None if _known_zero(g) else g for g in (g_record, g_out, g_h, g_c))
    one = ew.full((), 1.0, dtype)
    pre, cells = _part(record, 0, gates), _part(record, gates, gates + hidden)
    s_i, s_f, t_g, s_o = (_part(pre, k * hidden, (k + 1) * hidden) for k in range(4))
    s_i, s_f, s_o, t_g = ew.sigmoid(s_i), ew.sigmoid(s_f), ew.sigmoid(s_o), ew.tanh(t_g)
    t_c = ew.tanh(cells)
    if c0 is None:  # (nothing but c0's own gradient is asked for: it reads only the forget gates)
        c0 = ew.full(ctx.in_types[C0].shape, 0.0, dtype)
    c_before = _previous(cells, c0, reverse)
    # Per step: dc += dh c_from_h, and dpre (N, 4, H) = k * (dc for the first three gates,
    # dh for the output gate) with k the four gates' factors: one fused kernel reading one
    # row of k. (Written as (N, 4H) instead, the kernel's index arithmetic cost more than
    # the reshape step after it. As dc k_c + dh k_h, with each gate's factor zero in one,
    # it read two rows and the backward concatenated two (L, N, 4, H) tensors, and an
    # infinite dh made the input gates' gradients NaN through a zero factor.)
    c_from_h = ew.mul(s_o, ew.sub(one, ew.mul(t_c, t_c)))

    def gate_axis(x):
        return mv.reshape(x, (steps, batch, 1, hidden))
    k = mv.concat([gate_axis(ew.mul(t_g, ew.mul(s_i, ew.sub(one, s_i)))),
                   gate_axis(ew.mul(c_before, ew.mul(s_f, ew.sub(one, s_f)))),
                   gate_axis(ew.mul(s_i, ew.sub(one, ew.mul(t_g, t_g)))),
                   gate_axis(ew.mul(t_c, ew.mul(s_o, ew.sub(one, s_o))))], 2)
    from_cell = mv.expand(mv.concat([ew.full((1, 3, 1), True, types.bool_), ew.full((1, 1, 1), False, types.bool_)],
                                    1), (batch, 4, hidden))
    g_h_seq = _plus(g_out, None if g_record is None else _part(g_record, gates + hidden, gates + 2 * hidden))
    g_c_seq = None if g_record is None else _part(g_record, gates, gates + hidden)
    g_pre = None if g_record is None else _part(g_record, 0, gates)

    def at(x, t):  # x[t] as (N, C), None for None
        return None if x is None else _step(x, t)

    def across_gates(x):  # (N, H) -> (N, 4, H)
        return mv.expand(mv.reshape(x, (batch, 1, hidden)), (batch, 4, hidden))

    def gate_step(x, t):  # x[t] of an (L, N, 4, H) value
        return mv.reshape(mv.slice_(x, (t, 0, 0, 0), (t + 1, batch, 4, hidden), (1, 1, 1, 1)), (batch, 4, hidden))

    dh, dc = g_h, g_c
    d_pre: list = [None] * steps
    order = range(steps) if reverse else range(steps - 1, -1, -1)  # backward: the run order reversed
    last = order[-1]
    for t in order:
        dh = _plus(dh, at(g_h_seq, t))
        if dh is None:
            dh = ew.full((batch, hidden), 0.0, dtype)
        dc = _plus(_plus(dc, at(g_c_seq, t)), ew.mul(dh, _step(c_from_h, t)))
        d_step = ew.mul(ew.where(from_cell, across_gates(dc), across_gates(dh)), gate_step(k, t))
        d_step = d_pre[t] = _plus(mv.reshape(d_step, (batch, gates)), at(g_pre, t))
        dh = linalg.matmul(d_step, w_hh) if t != last or needs[H0] else None
        dc = ew.mul(dc, _step(s_f, t)) if t != last or needs[C0] else None
    grad_w = grad_b = None
    if not (needs[GI] or needs[W_HH] or needs[B_HH]):
        return None, dh, dc, None, None
    d_all = mv.concat([mv.reshape(d, (1, batch, gates)) for d in d_pre], 0)
    if needs[W_HH]:
        h_before = mv.reshape(_previous(_part(record, gates + hidden, gates + 2 * hidden), h0, reverse),
                              (steps * batch, hidden))
        grad_w = linalg.matmul(mv.permute(mv.reshape(d_all, (steps * batch, gates)), (1, 0)), h_before)
    if needs[B_HH]:
        grad_b = red.sum_(d_all, (0, 1))
    return (d_all if needs[GI] else None, dh, dc, grad_w, grad_b)


LSTM_LAYER = Primitive("lstm_layer", shape_rule=_lstm_layer_rule, impl=_lstm_layer_impl, kind=OTHER, num_outputs=4,
                       saves_inputs=(H0, C0, W_HH), saved_for={H0: (W_HH,), C0: (GI, H0, W_HH, B_HH)},
                       saves_output=True, vjp=_lstm_layer_vjp, backward_name="LstmLayerBackward")


def lstm_layer(gi, h0, c0, w_hh, b_hh, reverse: bool):
    """(record, out, h_n, c_n): see the module docstring."""
    return bind(LSTM_LAYER, (gi, h0, c0, w_hh, b_hh), {"reverse": reverse})
