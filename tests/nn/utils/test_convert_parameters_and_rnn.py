"""`nn.utils.parameters_to_vector` / `vector_to_parameters` and `nn.utils.rnn.pad_sequence`:
layout as PyTorch's, gradients (first and second order) through the composites, compiled
equal to eager, and errors."""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck
from tracegrad.nn.utils import parameters_to_vector, vector_to_parameters
from tracegrad.nn.utils.rnn import pad_sequence


def _model():
    tg.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 2), nn.Linear(2, 1))


def test_parameters_to_vector_concatenates_flattened_parameters_in_order():
    model = _model()
    vector = parameters_to_vector(model.parameters())
    expected = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    np.testing.assert_array_equal(vector.detach().numpy(), expected)
    assert vector.requires_grad
    assert vector.shape == (3 * 2 + 2 + 2 + 1,)


def test_vector_to_parameters_round_trips_and_keeps_the_parameter_objects():
    model = _model()
    params = list(model.parameters())
    vector_to_parameters(tg.arange(11, dtype=tg.float32), model.parameters())
    assert list(model.parameters()) == params
    np.testing.assert_array_equal(parameters_to_vector(model.parameters()).detach().numpy(), np.arange(11))
    np.testing.assert_array_equal(model[0].weight.detach().numpy(), np.arange(6).reshape(2, 3))
    assert all(p.requires_grad for p in params)


def test_vector_to_parameters_checks_its_arguments():
    with pytest.raises(TypeError, match="expected torch.Tensor, but got: list"):
        vector_to_parameters([1.0], _model().parameters())
    with pytest.raises(RuntimeError, match="the vector has 3 elements but the parameters have 11"):
        vector_to_parameters(tg.ones(3), _model().parameters())


def test_parameters_to_vector_is_differentiable():
    a = tg.tensor(np.ones((2, 2)), requires_grad=True)
    b = tg.tensor(np.ones(3), requires_grad=True)
    assert gradcheck(lambda a, b: parameters_to_vector([a, b]) * 2.0, (a, b))


def _sequences(transposed=False):
    rng = np.random.default_rng(0)
    shapes = [(3, 2), (1, 2), (4, 2)]
    arrays = [rng.standard_normal(shape[::-1] if transposed else shape) for shape in shapes]
    return [tg.from_numpy(a.T if transposed else a).requires_grad_() for a in arrays]


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("padding_side", ["right", "left"])
def test_pad_sequence_places_each_sequence_and_the_padding(batch_first, padding_side):
    sequences = _sequences()
    out = pad_sequence(sequences, batch_first=batch_first, padding_value=-7.0, padding_side=padding_side).detach()
    batch_major = out.numpy() if batch_first else out.numpy().transpose(1, 0, 2)
    assert batch_major.shape == (3, 4, 2)
    for row, seq in zip(batch_major, sequences):
        length = seq.shape[0]
        values, padding = (row[:length], row[length:]) if padding_side == "right" else (row[4 - length:],
                                                                                      row[:4 - length])
        np.testing.assert_array_equal(values, seq.detach().numpy())
        assert (padding == -7.0).all()


@pytest.mark.parametrize("check", [gradcheck, gradgradcheck])
@pytest.mark.parametrize("transposed", [False, True])
def test_pad_sequence_gradients(check, transposed):
    assert check(lambda a, b, c: pad_sequence([a, b, c], batch_first=True, padding_value=1.5) ** 2,
                 tuple(_sequences(transposed)))


def test_pad_sequence_with_size_0_and_size_1_sequences():
    out = pad_sequence([tg.zeros(0, 3), tg.ones(1, 3)], batch_first=True)
    np.testing.assert_array_equal(out.numpy(), [[[0, 0, 0]], [[1, 1, 1]]])


def test_pad_sequence_compiled_equals_eager():
    sequences = [s.detach() for s in _sequences()]

    def padded(a, b, c):
        return pad_sequence([a, b, c], padding_value=0.5) * 2.0
    np.testing.assert_allclose(tg.compile(padded)(*sequences).numpy(), padded(*sequences).numpy(), rtol=1e-12)


def test_pad_sequence_refuses_mismatched_trailing_shapes():
    with pytest.raises(RuntimeError, match="pad_sequence: expected every sequence to have shape"):
        pad_sequence([tg.ones(2, 3), tg.ones(2, 4)])


@pytest.mark.parametrize("options", [dict(), dict(batch_first=True, padding_value=2.0),
                                     dict(batch_first=True, padding_side="left")])
def test_pad_sequence_matches_torch(options):
    torch = pytest.importorskip("torch")
    arrays = [s.detach().numpy() for s in _sequences()]
    ours = pad_sequence([tg.tensor(a) for a in arrays], **options)
    theirs = torch.nn.utils.rnn.pad_sequence([torch.tensor(a) for a in arrays], **options)
    np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
