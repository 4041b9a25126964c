"""The one-op eager LSTM layer (`ops/lstm_layer.py`): an `nn.LSTM` layer's time loop is one
recorded node with the composite's values and gradients (both directions, to every order),
saving what the composite saves; short sequences, no bias and projections take the
composite; a compiled LSTM holds the same op and equals eager."""

import numpy as np
import pytest

import tracegrad as tg
import tracegrad.nn.functional as F
from tracegrad import functional
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.functional import eager_fusion
from tracegrad.ops import lstm_layer as ops

CHECKS = [gradcheck, gradgradcheck]


@pytest.fixture(autouse=True)
def _op_by_op(monkeypatch):
    """Each step's gates run through NumPy (no compiled programs) unless a test asks."""
    monkeypatch.setattr(eager_fusion, "MIN_ELEMENTS", 1 << 62)
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 1 << 62)


def _leaf(shape, seed=0, dtype=tg.float64, scale=1.0):
    rng = np.random.default_rng(seed)
    return tg.tensor(rng.standard_normal(shape) * scale, dtype=dtype, requires_grad=True)


class _traced_composite:
    """Make the functional layer take the composite path (as under a trace)."""

    def __enter__(self):
        from tracegrad.ops import neural
        self._saved, neural.DTYPES = neural.DTYPES, ()

    def __exit__(self, *exc):
        from tracegrad.ops import neural
        neural.DTYPES = self._saved


def _lstm(dtype=tg.float64, layers=2, bidirectional=False, seed=0, **kwargs):
    tg.manual_seed(seed)
    return tg.nn.LSTM(3, 4, layers, bidirectional=bidirectional, **kwargs).to(dtype)


def _states(lstm, batch, dtype=tg.float64, requires_grad=True):
    count = lstm.num_layers * (2 if lstm.bidirectional else 1)
    return (_leaf((count, batch, 4), 11, dtype, 0.5).requires_grad_(requires_grad),
            _leaf((count, batch, 4), 12, dtype, 0.5).requires_grad_(requires_grad))


def _loss(out, h, c):
    weights = [tg.tensor(np.random.default_rng(20 + k).standard_normal(t.shape), dtype=t.dtype)
               for k, t in enumerate((out, h, c))]
    return sum((t * w).sum() for t, w in zip((out, h, c), weights))


def _names(grad_fn, seen=None) -> set:
    """The grad_fn names in a graph."""
    seen = set() if seen is None else seen
    if grad_fn is not None and grad_fn.name() not in seen:
        seen.add(grad_fn.name())
        for parent, _ in grad_fn.next_functions:
            _names(parent, seen)
    return seen


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_an_eager_lstm_layer_is_one_op_with_the_composites_values_and_gradients(bidirectional, dtype):
    lstm = _lstm(dtype, bidirectional=bidirectional)
    x = _leaf((5, 2, 3), 1, dtype)
    h0, c0 = _states(lstm, 2, dtype)
    leaves = [x, h0, c0, *lstm.parameters()]
    out, (h, c) = lstm(x, (h0, c0))
    assert "LstmLayerBackward" in _names(out.grad_fn) and "LstmGatesBackward" not in _names(out.grad_fn)
    with _traced_composite():
        want_out, (want_h, want_c) = lstm(x, (h0, c0))
    assert "LstmLayerBackward" not in _names(want_out.grad_fn)
    tol = dict(rtol=1e-12, atol=1e-14) if dtype is tg.float64 else dict(rtol=2e-5, atol=1e-6)
    for got, want in zip((out, h, c), (want_out, want_h, want_c)):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), **tol)
        assert got.is_contiguous() and got.dtype is dtype
    grads = tg.autograd.grad(_loss(out, h, c), leaves)
    wants = tg.autograd.grad(_loss(want_out, want_h, want_c), leaves)
    for got, want in zip(grads, wants):
        np.testing.assert_allclose(got.numpy(), want.numpy(), **tol)


def test_an_lstm_layers_second_derivatives_are_the_composites():
    lstm = _lstm(bidirectional=True)
    x = _leaf((4, 2, 3), 2)
    h0, c0 = _states(lstm, 2)
    leaves = [x, h0, c0, *lstm.parameters()]

    def second(outputs):
        grads = tg.autograd.grad(_loss(*outputs[:1], *outputs[1]), leaves, create_graph=True)
        return tg.autograd.grad(sum((g * g).sum() for g in grads), leaves)
    with _traced_composite():
        wants = second(lstm(x, (h0, c0)))
    for got, want in zip(second(lstm(x, (h0, c0))), wants):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-10, atol=1e-12)


def test_an_infinite_output_gradient_gives_the_composites_gate_gradients_without_nans():
    # Each gate's gradient reads only the state gradient it depends on (dc for the input,
    # forget and cell gates, dh for the output gate), as the composite's per-step gates
    # do: an infinite dh must not reach another gate through a zero factor as NaN. (The
    # last step's pre-activation gradient, before any product mixes the gates.)
    gi, h0, c0, w_hh, b_hh = (_leaf((3, 2, 8), 1), _leaf((2, 2), 2, scale=0.5), _leaf((2, 2), 3, scale=0.5),
                              _leaf((8, 2), 4, scale=0.5), _leaf((8,), 5, scale=0.5))
    upstream = np.zeros((3, 2, 2))
    upstream[2, 0, 1] = np.inf

    def last_step_gradient(direction):
        out, _ = direction("LSTM", gi, (h0, c0), [None, w_hh, None, b_hh], False, None)
        return tg.autograd.grad((out * tg.tensor(upstream)).sum(), gi)[0].numpy()[2]
    from tracegrad.nn import rnn
    with _traced_composite():
        want = last_step_gradient(rnn._run_direction)
    got = last_step_gradient(rnn._run_direction)  # (the one op: 3 steps)
    assert np.isinf(want[0, [1, 3, 5, 7]]).all()  # (unit 1 of each gate)
    np.testing.assert_array_equal(got, want)


LAYER_SHAPES = {"batch": (3, 2, 2), "one_row_one_unit": (2, 1, 1), "empty_batch": (2, 0, 2), "no_units": (2, 2, 0)}


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("shape", LAYER_SHAPES)
def test_lstm_layer_gradients_of_every_output(shape, reverse, check):
    # (Second order: the record's cotangent, which only a second derivative brings, is
    # checked too.)
    steps, batch, hidden = LAYER_SHAPES[shape]
    args = (_leaf((steps, batch, 4 * hidden), 1), _leaf((batch, hidden), 2, scale=0.5),
            _leaf((batch, hidden), 3, scale=0.5), _leaf((4 * hidden, hidden), 4, scale=0.5),
            _leaf((4 * hidden,), 5, scale=0.5))
    assert check(lambda *a: ops.lstm_layer(*a, reverse), args)


def test_lstm_layer_gradients_of_some_inputs_and_views():
    gi = _leaf((6, 3, 8), 1).transpose(0, 1)  # (a non-contiguous (3, 6, 8) view)
    h0, c0 = _leaf((2, 6), 2).t(), _leaf((2, 6), 3).t()
    w, b = _leaf((8, 2), 4), _leaf((8,), 5)
    for needs in ([True, False, False, False, False], [False, False, True, False, False],
                  [False, True, False, True, False], [False, False, False, False, True]):
        def f(*picked, needs=needs):
            it = iter(picked)
            full = [next(it) if need else t.detach() for need, t in zip(needs, (gi, h0, c0, w, b))]
            return ops.lstm_layer(*full, False)[1:]
        assert gradcheck(f, [t for need, t in zip(needs, (gi, h0, c0, w, b)) if need])


def test_one_step_no_bias_and_a_projection_take_the_composite():
    for lstm, x in ((_lstm(), _leaf((1, 2, 3), 1)), (_lstm(bias=False), _leaf((4, 2, 3))),
                    (_lstm(proj_size=2), _leaf((4, 2, 3)))):
        out, _ = lstm(x)
        assert "LstmLayerBackward" not in _names(out.grad_fn)
    assert functional.lstm_layer(_leaf((1, 2, 8)), _leaf((2, 2)), _leaf((2, 2)), _leaf((8, 2)), _leaf((8,))) is None



def test_the_reference_mode_runs_the_composite():
    lstm = _lstm()
    x = _leaf((5, 2, 3), 1)
    with tg.reference_mode():
        out, _ = lstm(x)
    assert "LstmLayerBackward" not in _names(out.grad_fn) and "LstmGatesBackward" in _names(out.grad_fn)
    np.testing.assert_allclose(out.detach().numpy(), lstm(x)[0].detach().numpy(), rtol=1e-12, atol=1e-14)

def test_an_lstm_layer_without_grad_computes_the_same_values():
    lstm = _lstm()
    x = _leaf((5, 2, 3), 1)
    want, _ = lstm(x)
    with tg.no_grad():
        got, (h, c) = lstm(x)
    assert got.grad_fn is None and not got.requires_grad
    np.testing.assert_array_equal(got.numpy(), want.detach().numpy())
    detached, _ = lstm(x.detach())
    np.testing.assert_array_equal(detached.detach().numpy(), want.detach().numpy())


@pytest.mark.parametrize("updated", ["h0", "c0", "weight_hh_l0"])
def test_a_saved_input_updated_in_place_before_backward_is_refused_as_by_the_composite(updated):
    errors = []
    for composite in (False, True):
        lstm = _lstm(layers=1)
        h0, c0 = (t * 1.0 for t in _states(lstm, 2))
        x = _leaf((4, 2, 3), 1)
        if composite:
            with _traced_composite():
                out, _ = lstm(x, (h0, c0))
        else:
            out, _ = lstm(x, (h0, c0))
        target = {"h0": h0, "c0": c0}.get(updated)
        with tg.no_grad():
            (target if target is not None else getattr(lstm, updated)).mul_(2.0)
        with pytest.raises(RuntimeError, match="modified by an inplace operation") as raised:
            out.sum().backward()
        errors.append(str(raised.value).split(";")[0].split(":")[0])
    assert errors[0] == errors[1]


def test_h0_updated_in_place_is_allowed_when_the_weight_needs_no_grad_as_by_the_composite():
    grads = []
    for composite in (False, True):
        lstm = _lstm(layers=1)
        lstm.weight_hh_l0.requires_grad_(False)
        h0 = _leaf((1, 2, 4), 11) * 1.0
        x = _leaf((4, 2, 3), 1)
        if composite:
            with _traced_composite():
                out, _ = lstm(x, (h0, tg.zeros(1, 2, 4, dtype=tg.float64)))
        else:
            out, _ = lstm(x, (h0, tg.zeros(1, 2, 4, dtype=tg.float64)))
        with tg.no_grad():
            h0.add_(1.0)
        grads.append(tg.autograd.grad(out.sum(), [x])[0].numpy())
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12, atol=1e-14)


def test_results_and_inputs_updated_in_place_leave_the_gradient_as_the_composites():
    lstm = _lstm(layers=1)
    x = _leaf((4, 2, 3), 1)
    want = tg.autograd.grad(_loss(*(lambda o: (o[0], *o[1]))(lstm(x))), [x, *lstm.parameters()])
    gi = F.linear(x, lstm.weight_ih_l0, lstm.bias_ih_l0)
    out, h, c = functional.lstm_layer(gi, tg.zeros(2, 4, dtype=tg.float64), tg.zeros(2, 4, dtype=tg.float64),
                             lstm.weight_hh_l0, lstm.bias_hh_l0)
    total = _loss(out, h, c)
    with tg.no_grad():
        out.mul_(3.0)
        h.add_(1.0)
        c.zero_()
    gi.data.add_(5.0)  # (not saved: an update of the projected inputs changes nothing)
    got = tg.autograd.grad(total, [x, *lstm.parameters()])
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-12, atol=1e-14)
    assert not np.shares_memory(h.detach().numpy(), out.detach().numpy())


def test_a_bad_input_to_lstm_layer_names_it_and_the_types():
    with pytest.raises(RuntimeError, match=r"lstm_layer: expected gi \(L, N, 4H\) .* got f64\[2,3,7\]"):
        ops.lstm_layer(_leaf((2, 3, 7)), _leaf((3, 2)), _leaf((3, 2)), _leaf((8, 2)), _leaf((8,)), False)
    with pytest.raises(RuntimeError, match=r"lstm_layer: .* f32\[8\]"):
        ops.lstm_layer(_leaf((2, 3, 8)), _leaf((3, 2)), _leaf((3, 2)), _leaf((8, 2)), _leaf((8,), dtype=tg.float32),
                       False)


@pytest.mark.parametrize("dtype", [tg.float64, tg.float32])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_a_compiled_lstm_holds_the_one_op_layer_and_equals_eager(bidirectional, dtype, monkeypatch):
    monkeypatch.setattr(eager_fusion, "OP_MIN_ELEMENTS", 1)  # (the gates' compiled program from the second call)
    lstm = _lstm(dtype, bidirectional=bidirectional)
    tol = dict(rtol=1e-11, atol=1e-13) if dtype is tg.float64 else dict(rtol=2e-4, atol=1e-5)

    def step(x):
        out, (h, c) = lstm(x)
        loss = (out * out).sum() + h.sum() + (c * 3).sum()
        return loss, tg.autograd.grad(loss, [x, *lstm.parameters()])

    compiled = tg.compile(step)
    for seed in range(3):
        x = _leaf((6, 2, 3), seed, dtype)
        (loss, grads), (want_loss, want_grads) = compiled(x), step(x)
        with _traced_composite():
            (composite_loss, _) = step(x)
        np.testing.assert_allclose(composite_loss.detach().numpy(), want_loss.detach().numpy(), **tol)
        np.testing.assert_allclose(loss.detach().numpy(), want_loss.detach().numpy(), **tol)
        for got, want in zip(grads, want_grads):
            np.testing.assert_allclose(got.numpy(), want.numpy(), **tol)
    report = compiled.explain(_leaf((6, 2, 3), 0, dtype))
    ops = [node.op.name for node in report.graphs[-1].graph.nodes]
    assert ops.count("lstm_layer") == (4 if bidirectional else 2) and "lstm_gates" not in ops


def test_a_layer_of_w8s_size_has_the_composites_values_to_the_bit(monkeypatch):
    # Big enough that the recurrent products run on the generated GEMM, with W_hh packed
    # once for the layer (`linalg.fixed_right_product`): the composite packs it per step.
    monkeypatch.delenv("TRACEGRAD_MATMUL", raising=False)
    tg.manual_seed(0)
    lstm = tg.nn.LSTM(200, 200, 1)
    x = tg.randn(12, 20, 200)
    state = (tg.randn(1, 20, 200), tg.randn(1, 20, 200))
    for _ in range(3):  # (the generated kernel is taken from a product's third sighting)
        with tg.no_grad():
            out, (h, c) = lstm(x, state)
            with _traced_composite():
                want_out, (want_h, want_c) = lstm(x, state)
    for got, want in zip((out, h, c), (want_out, want_h, want_c)):
        np.testing.assert_array_equal(got.numpy(), want.numpy())
