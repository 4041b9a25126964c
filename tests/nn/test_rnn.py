"""`nn/rnn.py` (RNNCell, LSTMCell, GRUCell, RNN, LSTM, GRU) and `nn/utils/rnn.py` (packed
sequences): gradients against finite differences (inputs, initial states and parameters,
float64), compiled equal to eager, a Python time loop over a cell compiled once per
sequence length, PyTorch's parameter names, shapes, initialization, state shapes and
errors; compared with PyTorch from the same state_dict where it is installed."""

import math

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.nn.utils import rnn as rnn_utils


def _randn(*shape, seed=0, requires_grad=True):
    return tg.from_numpy(np.random.default_rng(seed).standard_normal(shape)).requires_grad_(requires_grad)


def _seeded(factory):
    tg.manual_seed(0)
    return factory().double()


# name -> (module factory, input shapes: x, then the initial state(s)); the module is called
# as module(x, h) for one state and module(x, (h, c)) for two. Tiny sizes: gradcheck
# perturbs every parameter.
CASES = {
    "rnn_cell_tanh": (lambda: nn.RNNCell(3, 2), [(2, 3), (2, 2)]),
    "rnn_cell_relu_unbatched": (lambda: nn.RNNCell(3, 2, nonlinearity="relu"), [(3,), (2,)]),
    "lstm_cell": (lambda: nn.LSTMCell(3, 2), [(2, 3), (2, 2), (2, 2)]),
    "gru_cell_no_bias": (lambda: nn.GRUCell(3, 2, bias=False), [(2, 3), (2, 2)]),
    "rnn_two_layers_bidirectional": (lambda: nn.RNN(2, 2, num_layers=2, bidirectional=True),
                                     [(2, 1, 2), (4, 1, 2)]),
    "rnn_relu_batch_first": (lambda: nn.RNN(2, 3, nonlinearity="relu", batch_first=True), [(2, 3, 2), (1, 2, 3)]),
    "lstm_bidirectional_proj": (lambda: nn.LSTM(2, 3, bidirectional=True, proj_size=2),
                                [(2, 1, 2), (2, 1, 2), (2, 1, 3)]),
    "lstm_two_layers_unbatched": (lambda: nn.LSTM(2, 1, num_layers=2), [(2, 2), (2, 1), (2, 1)]),
    "gru_two_layers_bidirectional": (lambda: nn.GRU(2, 1, num_layers=2, bidirectional=True),
                                     [(2, 1, 2), (4, 1, 1)]),
    "gru_batch_first_no_bias": (lambda: nn.GRU(2, 2, bias=False, batch_first=True), [(2, 3, 2), (1, 2, 2)]),
}


def _call(module, x, *states):
    """The module's outputs as a flat tuple of tensors."""
    if not states:
        out = module(x)
    else:
        out = module(x, states[0] if len(states) == 1 else tuple(states))
    flat = []
    for item in (out if isinstance(out, tuple) else (out,)):
        flat.extend(item if isinstance(item, tuple) else (item,))
    return tuple(flat)


def _inputs(shapes, seed=1):
    return [_randn(*shape, seed=seed + i) for i, shape in enumerate(shapes)]


@pytest.mark.parametrize("name", CASES)
def test_gradients_of_inputs_states_and_parameters_match_finite_differences(name):
    factory, shapes = CASES[name]
    module = _seeded(factory)
    params = list(module.parameters())
    inputs = _inputs(shapes)
    # gradcheck perturbs each input's buffer in place, the parameters' too: the module reads them.
    assert gradcheck(lambda *xs: _call(module, *xs[:len(inputs)]), tuple(inputs + params))


@pytest.mark.parametrize("name", ["rnn_cell_tanh", "lstm_cell", "gru_cell_no_bias", "rnn_relu_batch_first",
                                  "lstm_bidirectional_proj", "gru_batch_first_no_bias"])
def test_second_order_gradients_of_inputs_and_states_match_finite_differences(name):
    factory, shapes = CASES[name]
    module = _seeded(factory)
    assert gradgradcheck(lambda *xs: _call(module, *xs), tuple(_inputs(shapes)))


@pytest.mark.parametrize("name", ["rnn_relu_batch_first", "gru_batch_first_no_bias"])
def test_gradients_of_a_transposed_batch_first_input(name):
    factory, shapes = CASES[name]
    module = _seeded(factory)
    batch, steps, features = shapes[0]
    x = tg.from_numpy(np.random.default_rng(5).standard_normal((features, steps, batch)).T).requires_grad_()
    assert not x.is_contiguous() and x.shape == shapes[0]
    assert gradcheck(lambda x, h: _call(module, x, h), (x, _randn(*shapes[1], seed=6)))


@pytest.mark.parametrize("name", CASES)
def test_compiled_outputs_and_gradients_equal_eager(name):
    factory, shapes = CASES[name]
    module = _seeded(factory)
    params = list(module.parameters())

    def step(*xs):
        outs = _call(module, *xs)
        loss = sum((out * out).sum() for out in outs)
        return outs, tg.autograd.grad(loss, list(xs) + params)

    compiled = tg.compile(step)
    want_outs, want_grads = step(*_inputs(shapes))
    for _ in range(2):
        outs, grads = compiled(*_inputs(shapes))
        for got, want in zip(list(outs) + list(grads), list(want_outs) + list(want_grads)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)


def test_a_time_loop_over_a_cell_compiles_one_program_per_sequence_length():
    cell = _seeded(lambda: nn.LSTMCell(3, 4))

    def run(x):
        h = c = tg.zeros(x.shape[1], 4, dtype=x.dtype)
        for t in range(x.shape[0]):
            h, c = cell(x[t], (h, c))
        return h

    compiled = tg.compile(run)
    for steps in (3, 5, 3, 5, 3):
        x = _randn(steps, 2, 3, seed=steps, requires_grad=False)
        np.testing.assert_allclose(compiled(x).detach().numpy(), run(x).detach().numpy(), rtol=1e-12, atol=1e-12)
    info = compiled.cache_info()
    assert (info.graphs, info.misses, info.hits) == (2, 2, 3)
    report = compiled.explain(_randn(5, 2, 3, seed=9, requires_grad=False))
    assert [event.hit for event in report.cache_events] == [True]


def test_a_compiled_training_step_of_an_lstm_updates_its_weights_as_eager():
    def make():
        tg.manual_seed(0)
        model = nn.LSTM(3, 4, num_layers=2).double()
        return model, tg.optim.SGD(model.parameters(), lr=0.1)

    def step(model, optimizer, x):
        optimizer.zero_grad()
        out, _ = model(x)
        loss = (out * out).mean()
        loss.backward()
        optimizer.step()
        return loss

    eager_model, eager_opt = make()
    compiled_model, compiled_opt = make()
    compiled_step = tg.compile(lambda x: step(compiled_model, compiled_opt, x))
    for i in range(3):
        x = _randn(4, 2, 3, seed=i, requires_grad=False)
        np.testing.assert_allclose(compiled_step(x).item(), step(eager_model, eager_opt, x).item(), rtol=1e-12)
    for got, want in zip(compiled_model.parameters(), eager_model.parameters()):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_a_followed_compiled_call_takes_each_time_step_whole(kind, composite_jumps):
    # (An LSTM with a projection: without one, each layer is one op, `ops/lstm_layer.py`.)
    tg.manual_seed(0)
    model = getattr(nn, kind)(3, 4, num_layers=2, **({"proj_size": 2} if kind == "LSTM" else {})).double()

    def step(x):
        out, _ = model(x)
        return (out * out).sum()

    compiled = tg.compile(step)
    for i in range(3):
        x = _randn(5, 2, 3, seed=i, requires_grad=False)
        np.testing.assert_allclose(compiled(x).item(), step(x).item(), rtol=1e-12)
    steps = [name for name in composite_jumps if name.endswith("_step")]
    assert steps == [f"_{kind.lower()}_step"] * (2 * 5 * 2)  # 2 followed calls, 5 steps, 2 layers


# --- PyTorch's parameters, shapes and initialization --------------------------------------------

def test_parameter_names_and_shapes_follow_pytorch():
    model = nn.LSTM(3, 5, num_layers=2, bidirectional=True, proj_size=2)
    shapes = {name: p.shape for name, p in model.named_parameters()}
    layer0 = {"weight_ih_l0": (20, 3), "weight_hh_l0": (20, 2), "bias_ih_l0": (20,), "bias_hh_l0": (20,),
              "weight_hr_l0": (2, 5)}
    layer1 = {"weight_ih_l1": (20, 4), "weight_hh_l1": (20, 2), "bias_ih_l1": (20,), "bias_hh_l1": (20,),
              "weight_hr_l1": (2, 5)}
    expected = []
    for layer in (layer0, layer1):
        expected += list(layer.items()) + [(name + "_reverse", shape) for name, shape in layer.items()]
    assert list(shapes.items()) == expected
    assert list(model.state_dict()) == [name for name, _ in expected]
    assert [len(ws) for ws in model.all_weights] == [5, 5, 5, 5]
    gru = nn.GRU(3, 4, bias=False)
    assert [(n, p.shape) for n, p in gru.named_parameters()] == [("weight_ih_l0", (12, 3)), ("weight_hh_l0", (12, 4))]
    cell = nn.GRUCell(3, 4)
    assert [(n, p.shape) for n, p in cell.named_parameters()] == [
        ("weight_ih", (12, 3)), ("weight_hh", (12, 4)), ("bias_ih", (12,)), ("bias_hh", (12,))]


@pytest.mark.parametrize("factory", [lambda: nn.LSTM(8, 16, num_layers=2), lambda: nn.GRUCell(8, 16),
                                     lambda: nn.RNN(8, 16, bidirectional=True)])
def test_parameters_are_initialized_uniform_within_one_over_sqrt_hidden(factory):
    values = np.concatenate([p.detach().numpy().ravel() for p in factory().parameters()])
    bound = 1 / math.sqrt(16)
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.95 * bound
    assert abs(values.mean()) < 0.02 and values.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)


@pytest.mark.parametrize("kwargs, x_shape, out_shape, state_shapes", [
    ({}, (5, 3, 2), (5, 3, 4), [(1, 3, 4)]),
    ({"batch_first": True}, (3, 5, 2), (3, 5, 4), [(1, 3, 4)]),
    ({"num_layers": 3, "bidirectional": True}, (5, 3, 2), (5, 3, 8), [(6, 3, 4)]),
    ({"bidirectional": True}, (5, 2), (5, 8), [(2, 4)]),
    ({"proj_size": 2, "num_layers": 2}, (5, 3, 2), (5, 3, 2), [(2, 3, 2), (2, 3, 4)]),
    ({"proj_size": 3, "bidirectional": True, "batch_first": True}, (1, 1, 2), (1, 1, 6), [(2, 1, 3), (2, 1, 4)]),
    ({}, (1, 0, 2), (1, 0, 4), [(1, 0, 4)]),
])
@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_output_and_final_state_shapes(kind, kwargs, x_shape, out_shape, state_shapes):
    if "proj_size" in kwargs and kind != "LSTM":
        pytest.skip("proj_size is an LSTM option")
    if kind == "LSTM" and len(state_shapes) == 1:
        state_shapes = state_shapes * 2
    output, state = getattr(nn, kind)(2, 4, **kwargs)(tg.zeros(*x_shape))
    states = state if kind == "LSTM" else (state,)
    assert output.shape == out_shape and [s.shape for s in states] == state_shapes[:len(states)]


@tg.no_grad()
def test_bias_false_differs_from_zero_biases_only_in_its_parameters():
    with_bias, without = _seeded(lambda: nn.GRU(2, 3)), _seeded(lambda: nn.GRU(2, 3, bias=False))
    with tg.no_grad():
        without.weight_ih_l0.copy_(with_bias.weight_ih_l0)
        without.weight_hh_l0.copy_(with_bias.weight_hh_l0)
        with_bias.bias_ih_l0.zero_()
        with_bias.bias_hh_l0.zero_()
    x = _randn(4, 2, 2, requires_grad=False)
    np.testing.assert_allclose(without(x)[0].numpy(), with_bias(x)[0].numpy(), rtol=1e-14)


@tg.no_grad()
def test_dropout_applies_between_layers_in_training_only():
    model = _seeded(lambda: nn.RNN(2, 3, num_layers=2, dropout=1.0))
    x = _randn(4, 2, 2, requires_grad=False)
    h0 = _randn(2, 2, 3, seed=3, requires_grad=False)
    # With every element of layer 0's output dropped, layer 1 runs on zeros.
    top = _seeded(lambda: nn.RNN(3, 3))
    with tg.no_grad():
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(top, f"{kind}_l0").copy_(getattr(model, f"{kind}_l1"))
    out, _ = model(x, h0)
    want, _ = top(tg.zeros(4, 2, 3, dtype=tg.float64), h0[1:])
    np.testing.assert_allclose(out.numpy(), want.numpy(), rtol=1e-14)
    model.eval()
    assert not np.allclose(model(x, h0)[0].numpy(), want.numpy())


def test_dropout_with_one_layer_warns_as_pytorch():
    with pytest.warns(UserWarning, match="non-zero dropout expects num_layers greater than 1"):
        nn.LSTM(2, 3, dropout=0.5)


def test_flatten_parameters_is_a_no_op():
    model = nn.LSTM(2, 3)
    before = [p.detach().numpy().copy() for p in model.parameters()]
    assert model.flatten_parameters() is None
    assert all(np.array_equal(a, p.detach().numpy()) for a, p in zip(before, model.parameters()))


def test_unbatched_input_gives_the_batched_result_of_a_batch_of_one():
    model = _seeded(lambda: nn.LSTM(2, 3, num_layers=2, bidirectional=True))
    x, h, c = _randn(4, 2, requires_grad=False), _randn(4, 3, seed=1), _randn(4, 3, seed=2)
    out, (h_n, c_n) = model(x, (h, c))
    out_b, (h_b, c_b) = model(x[:, None], (h[:, None], c[:, None]))
    for got, want in ((out, out_b[:, 0]), (h_n, h_b[:, 0]), (c_n, c_b[:, 0])):
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-14)


@tg.no_grad()
def test_the_reverse_direction_reads_the_sequence_backwards():
    model = _seeded(lambda: nn.GRU(2, 3, bidirectional=True))
    forward_only = _seeded(lambda: nn.GRU(2, 3))
    with tg.no_grad():
        for kind in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            getattr(forward_only, f"{kind}_l0").copy_(getattr(model, f"{kind}_l0_reverse"))
    x = _randn(5, 2, 2, requires_grad=False)
    out, h_n = model(x)
    reverse_out, reverse_h = forward_only(x.flip(0))
    np.testing.assert_allclose(out[:, :, 3:].numpy(), reverse_out.flip(0).numpy(), rtol=1e-14)
    np.testing.assert_allclose(h_n[1].numpy(), reverse_h[0].numpy(), rtol=1e-14)


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.LSTM(2, 3)(tg.zeros(2, 2, 2, 2)), ValueError, "LSTM: Expected input to be 2D or 3D, got 4D"),
    (lambda: nn.GRU(2, 3)(tg.zeros(4, 1, 5)), RuntimeError,
     "input.size\\(-1\\) must be equal to input_size. Expected 2, got 5"),
    (lambda: nn.RNN(2, 3)(tg.zeros(4, 2, 2), tg.zeros(1, 3, 3)), RuntimeError,
     r"Expected hidden size \(1, 2, 3\), got \[1, 3, 3\]"),
    (lambda: nn.LSTM(2, 3)(tg.zeros(4, 2, 2), (tg.zeros(1, 2, 3), tg.zeros(1, 2, 2))), RuntimeError,
     r"Expected hidden\[1\] size \(1, 2, 3\), got \[1, 2, 2\]"),
    (lambda: nn.GRU(2, 3)(tg.zeros(4, 2, 2), tg.zeros(2, 3)), RuntimeError,
     "For batched 3-D input, hx should also be 3-D"),
    (lambda: nn.RNN(2, 3)(tg.zeros(4, 2, 2, dtype=tg.float64)), ValueError, "input must have the type"),
    (lambda: nn.RNN(2, 3)(tg.zeros(0, 2, 2)), RuntimeError, "Expected sequence length to be larger than 0"),
    (lambda: nn.GRU(2, 3, proj_size=1), ValueError, "proj_size argument is only supported for LSTM"),
    (lambda: nn.LSTM(2, 3, proj_size=3), ValueError, "proj_size has to be smaller than hidden_size"),
    (lambda: nn.RNN(2, 3, nonlinearity="gelu"), ValueError, "Unknown nonlinearity 'gelu'"),
    (lambda: nn.LSTM(2, 0), ValueError, "hidden_size must be greater than zero"),
    (lambda: nn.LSTM(2, 3, dropout=1.5), ValueError, "dropout should be a number in range"),
    (lambda: nn.RNNCell(3, 2)(tg.zeros(2, 2, 3)), ValueError, "RNNCell: Expected input to be 1D or 2D, got 3D"),
    (lambda: nn.LSTMCell(3, 2)(tg.zeros(2, 4)), RuntimeError, "input has inconsistent input_size: got 4 expected 3"),
    (lambda: nn.GRUCell(3, 2)(tg.zeros(2, 3), tg.zeros(3, 2)), RuntimeError,
     "Input batch size 2 doesn't match hidden0 batch size 3"),
    (lambda: nn.LSTMCell(3, 2)(tg.zeros(2, 3), (tg.zeros(2, 2), tg.zeros(2, 5))), RuntimeError,
     "hidden1 has inconsistent hidden_size: got 5, expected 2"),
])
def test_bad_input_is_refused_with_pytorchs_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_module_repr_is_pytorchs():
    assert repr(nn.LSTM(3, 4, proj_size=2, num_layers=2, bidirectional=True)) == \
        "LSTM(3, 4, proj_size=2, num_layers=2, bidirectional=True)"
    assert repr(nn.GRU(3, 4, bias=False, batch_first=True, dropout=0.5, num_layers=2)) == \
        "GRU(3, 4, num_layers=2, bias=False, batch_first=True, dropout=0.5)"
    assert repr(nn.RNNCell(3, 4, bias=False, nonlinearity="relu")) == "RNNCell(3, 4, bias=False, nonlinearity=relu)"


# --- packed sequences ---------------------------------------------------------------------------

def test_pack_and_pad_round_trip_with_lengths_in_any_order():
    x = _randn(4, 3, 2, requires_grad=False)
    packed = rnn_utils.pack_padded_sequence(x, [2, 4, 1], enforce_sorted=False)
    assert packed.batch_sizes.tolist() == [3, 2, 1, 1] and packed.data.shape == (7, 2)
    assert packed.sorted_indices.tolist() == [1, 0, 2] and packed.unsorted_indices.tolist() == [1, 0, 2]
    padded, lengths = rnn_utils.pad_packed_sequence(packed, padding_value=-1.0, total_length=5)
    assert lengths.tolist() == [2, 4, 1] and padded.shape == (5, 3, 2)
    keep = np.arange(5)[:, None] < np.array([2, 4, 1])[None, :]
    want = np.where(keep[..., None], np.concatenate([x.numpy(), np.zeros((1, 3, 2))]), -1.0)
    np.testing.assert_array_equal(padded.numpy(), want)


def test_pack_padded_sequence_refuses_unsorted_lengths_when_enforce_sorted():
    with pytest.raises(RuntimeError, match="must be sorted in decreasing order when `enforce_sorted` is True"):
        rnn_utils.pack_padded_sequence(tg.zeros(3, 2, 1), [1, 3])


def test_pad_sequence_pads_right_or_left():
    a, b = tg.ones(3, 2), tg.full((1, 2), 2.0)
    assert rnn_utils.pad_sequence([a, b]).shape == (3, 2, 2)
    left = rnn_utils.pad_sequence([a, b], batch_first=True, padding_value=-1.0, padding_side="left")
    assert left[1, :, 0].tolist() == [-1.0, -1.0, 2.0]
    unpacked = rnn_utils.unpack_sequence(rnn_utils.pack_sequence([a, b]))
    assert [u.shape for u in unpacked] == [(3, 2), (1, 2)]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_a_packed_batch_gives_each_sequence_its_own_unpadded_result(kind):
    model = _seeded(lambda: getattr(nn, kind)(2, 3, num_layers=2, bidirectional=True, batch_first=True))
    lengths = [2, 5, 3]
    x = _randn(3, 5, 2, requires_grad=False)
    out, state = model(rnn_utils.pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
    padded, _ = rnn_utils.pad_packed_sequence(out, batch_first=True)
    h_n = state[0] if kind == "LSTM" else state
    for b, length in enumerate(lengths):
        alone, alone_state = model(x[b, :length])
        alone_h = alone_state[0] if kind == "LSTM" else alone_state
        np.testing.assert_allclose(padded[b, :length].detach().numpy(), alone.detach().numpy(), rtol=1e-12, atol=1e-14)
        assert not padded[b, length:].detach().numpy().any()
        np.testing.assert_allclose(h_n[:, b].detach().numpy(), alone_h.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_gradients_through_a_packed_lstm_match_finite_differences():
    model = _seeded(lambda: nn.LSTM(1, 1, bidirectional=True))

    def run(x, h, c):
        packed = rnn_utils.pack_padded_sequence(x, [1, 3], enforce_sorted=False)
        out, (h_n, c_n) = model(packed, (h, c))
        return rnn_utils.pad_packed_sequence(out)[0], h_n, c_n

    assert gradcheck(run, (_randn(3, 2, 1), _randn(2, 2, 1, seed=1), _randn(2, 2, 1, seed=2)))


# --- PyTorch as the oracle ----------------------------------------------------------------------

def _torch_pair(kind, *args, **kwargs):
    torch = pytest.importorskip("torch")
    theirs = getattr(torch.nn, kind)(*args, **kwargs).double()
    ours = getattr(nn, kind)(*args, **kwargs).double()
    # PyTorch's state_dict, loaded as it comes (names and shapes must agree).
    ours.load_state_dict({k: tg.from_numpy(v.detach().numpy().copy()) for k, v in theirs.state_dict().items()})
    return torch, ours, theirs


def _flat(out):
    flat = []
    for item in (out if isinstance(out, tuple) else (out,)):
        flat.extend(item if isinstance(item, tuple) else (item,))
    return flat


def _compare_with_torch(torch, ours, theirs, arrays, wrap_state):
    tg_in = [tg.from_numpy(a.copy()).requires_grad_() for a in arrays]
    torch_in = [torch.from_numpy(a.copy()).requires_grad_() for a in arrays]
    tg_out, torch_out = _flat(ours(*wrap_state(tg_in))), _flat(theirs(*wrap_state(torch_in)))
    rng = np.random.default_rng(7)
    weights = [rng.standard_normal(tuple(o.shape)) for o in torch_out]
    sum((o * tg.from_numpy(w)).sum() for o, w in zip(tg_out, weights)).backward()
    sum((o * torch.from_numpy(w)).sum() for o, w in zip(torch_out, weights)).backward()
    pairs = list(zip(tg_out, torch_out)) + [(a.grad, b.grad) for a, b in zip(tg_in, torch_in)]
    theirs_params = dict(theirs.named_parameters())
    pairs += [(p.grad, theirs_params[name].grad) for name, p in ours.named_parameters()]
    for got, want in pairs:
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)


def _arrays(*shapes):
    return [np.random.default_rng(11 + i).standard_normal(s) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("kind, args, kwargs, shapes", [
    ("LSTM", (3, 5), {"num_layers": 2, "bidirectional": True, "proj_size": 2}, [(4, 2, 3), (4, 2, 2), (4, 2, 5)]),
    ("LSTM", (3, 4), {"batch_first": True}, [(2, 4, 3), (1, 2, 4), (1, 2, 4)]),
    ("GRU", (3, 4), {"num_layers": 2, "bidirectional": True}, [(4, 2, 3), (4, 2, 4)]),
    ("GRU", (3, 4), {"bias": False}, [(4, 3), (1, 4)]),
    ("RNN", (3, 4), {"nonlinearity": "relu", "num_layers": 2, "batch_first": True}, [(2, 4, 3), (2, 2, 4)]),
    ("RNN", (3, 4), {"bidirectional": True}, [(4, 2, 3), (2, 2, 4)]),
], ids=["lstm_proj_bidirectional_2_layers", "lstm_batch_first", "gru_bidirectional_2_layers",
        "gru_unbatched_no_bias", "rnn_relu_batch_first", "rnn_bidirectional"])
def test_modules_match_torch_from_its_state_dict(kind, args, kwargs, shapes):
    torch, ours, theirs = _torch_pair(kind, *args, **kwargs)
    lstm = kind == "LSTM"
    _compare_with_torch(torch, ours, theirs, _arrays(*shapes),
                        lambda xs: (xs[0], (xs[1], xs[2])) if lstm else (xs[0], xs[1]))


@pytest.mark.parametrize("kind, shapes", [
    ("RNNCell", [(2, 3), (2, 4)]), ("LSTMCell", [(2, 3), (2, 4), (2, 4)]), ("GRUCell", [(3,), (4,)])])
def test_cells_match_torch_from_its_state_dict(kind, shapes):
    torch, ours, theirs = _torch_pair(kind, 3, 4)
    lstm = kind == "LSTMCell"
    _compare_with_torch(torch, ours, theirs, _arrays(*shapes),
                        lambda xs: (xs[0], (xs[1], xs[2])) if lstm else (xs[0], xs[1]))


def test_a_packed_bidirectional_lstm_matches_torch():
    torch, ours, theirs = _torch_pair("LSTM", 3, 4, num_layers=2, bidirectional=True, proj_size=2)
    x, h, c = _arrays((5, 3, 3), (4, 3, 2), (4, 3, 4))
    lengths = [3, 5, 2]

    def run(module, lib, utils, tensors):
        packed = utils.pack_padded_sequence(tensors[0], lengths, enforce_sorted=False)
        out, (h_n, c_n) = module(packed, (tensors[1], tensors[2]))
        return utils.pad_packed_sequence(out)[0], h_n, c_n

    tg_in = [tg.from_numpy(a.copy()).requires_grad_() for a in (x, h, c)]
    torch_in = [torch.from_numpy(a.copy()).requires_grad_() for a in (x, h, c)]
    tg_out = run(ours, tg, rnn_utils, tg_in)
    torch_out = run(theirs, torch, torch.nn.utils.rnn, torch_in)
    sum((o * o).sum() for o in tg_out).backward()
    sum((o * o).sum() for o in torch_out).backward()
    for got, want in list(zip(tg_out, torch_out)) + [(a.grad, b.grad) for a, b in zip(tg_in, torch_in)]:
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)
