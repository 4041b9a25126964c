"""`nn/transformer.py`: encoder and decoder layers, their stacks and `Transformer`, post- and
pre-norm, activations by name or callable; gradients against finite differences (float64,
dropout 0), compiled equal to eager, PyTorch's submodule names, the causal mask, errors;
compared with PyTorch from the same state_dict where it is installed."""

import math
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck


def _randn(*shape, seed=0, requires_grad=True):
    return tg.from_numpy(np.random.default_rng(seed).standard_normal(shape)).requires_grad_(requires_grad)


def _padding():
    return tg.tensor([[False, False, True], [False, False, False]])


def _causal(size):
    return nn.Transformer.generate_square_subsequent_mask(size, dtype=tg.float64)


# name -> (module factory taking the library `m` and the activation, call of the module on
# (src, tgt) with masks built by `m`, shapes of src and tgt); d_model 4, 2 heads, dropout 0.
CASES = {
    "encoder_layer_post_norm": (
        lambda m, act: m.nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, activation=act),
        lambda m, mod, src, tgt: mod(src, src_key_padding_mask=m.tensor([[False, False, True], [False] * 3])),
        [(3, 2, 4)]),
    "encoder_layer_pre_norm_gelu_batch_first": (
        lambda m, act: m.nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, activation="gelu", batch_first=True,
                                                    norm_first=True),
        lambda m, mod, src, tgt: mod(src, src_mask=m.nn.Transformer.generate_square_subsequent_mask(
            3, dtype=m.float64), is_causal=True),
        [(2, 3, 4)]),
    "encoder_two_layers_with_norm": (
        lambda m, act: m.nn.TransformerEncoder(m.nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0), 2,
                                               norm=m.nn.LayerNorm(4)),
        lambda m, mod, src, tgt: mod(src),
        [(3, 2, 4)]),
    "decoder_layer_callable_activation": (
        lambda m, act: m.nn.TransformerDecoderLayer(4, 2, 6, dropout=0.0, activation=act),
        lambda m, mod, src, tgt: mod(tgt, src, tgt_mask=m.nn.Transformer.generate_square_subsequent_mask(
            2, dtype=m.float64), memory_key_padding_mask=m.tensor([[False, False, True], [False] * 3])),
        [(3, 2, 4), (2, 2, 4)]),
    "decoder_pre_norm_unbatched": (
        lambda m, act: m.nn.TransformerDecoder(m.nn.TransformerDecoderLayer(4, 2, 6, dropout=0.0, norm_first=True), 1),
        lambda m, mod, src, tgt: mod(tgt, src),
        [(3, 4), (2, 4)]),
    "transformer": (
        lambda m, act: m.nn.Transformer(4, 2, 1, 1, 6, dropout=0.0),
        lambda m, mod, src, tgt: mod(src, tgt, tgt_mask=m.nn.Transformer.generate_square_subsequent_mask(
            2, dtype=m.float64), src_key_padding_mask=m.tensor([[False, False, True], [False] * 3])),
        [(3, 2, 4), (2, 2, 4)]),
}


def _silu(m):
    return m.nn.functional.silu


def _build(name, m=tg):
    factory, _, _ = CASES[name]
    if m is tg:
        tg.manual_seed(0)
    return factory(m, _silu(m)).double()


def _inputs(name, seed=1):
    shapes = CASES[name][2]
    return [_randn(*s, seed=seed + i) for i, s in enumerate(shapes)]


def _runner(name, module):
    call = CASES[name][1]
    count = len(CASES[name][2])
    return lambda *xs: call(tg, module, xs[0], xs[1] if count > 1 else None)


@pytest.mark.parametrize("name", CASES)
def test_gradients_of_inputs_match_finite_differences(name):
    assert gradcheck(_runner(name, _build(name)), tuple(_inputs(name)))


@pytest.mark.parametrize("name", ["encoder_layer_post_norm", "decoder_layer_callable_activation"])
def test_gradients_of_parameters_match_finite_differences(name):
    module = _build(name)
    inputs = [x.detach() for x in _inputs(name)]
    run = _runner(name, module)
    # gradcheck perturbs each parameter's buffer in place: the module reads them.
    assert gradcheck(lambda *params: run(*inputs), tuple(module.parameters()))


@pytest.mark.parametrize("name", ["encoder_layer_post_norm", "decoder_pre_norm_unbatched"])
def test_second_order_gradients_match_finite_differences(name):
    module = _build(name)
    assert gradgradcheck(_runner(name, module), tuple(_inputs(name)))


@pytest.mark.parametrize("name", CASES)
def test_compiled_equals_eager(name):
    module = _build(name)
    run = _runner(name, module)
    params = list(module.parameters())

    def step(*xs):
        out = run(*xs)
        return out, tg.autograd.grad((out * out).sum(), list(xs) + params)

    compiled = tg.compile(step)
    want_out, want_grads = step(*_inputs(name))
    for _ in range(2):
        out, grads = compiled(*_inputs(name))
        for got, want in zip([out] + list(grads), [want_out] + list(want_grads)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-11)


def test_square_subsequent_mask_is_minus_infinity_above_the_diagonal():
    mask = nn.Transformer.generate_square_subsequent_mask(3)
    assert mask.dtype is tg.float32
    assert mask.tolist() == [[0.0, -math.inf, -math.inf], [0.0, 0.0, -math.inf], [0.0, 0.0, 0.0]]


def test_a_causal_decoder_output_at_a_position_ignores_later_targets():
    model = _build("transformer")
    src = _randn(3, 2, 4, requires_grad=False)
    tgt = _randn(4, 2, 4, seed=1, requires_grad=False)
    changed = tgt.detach().clone()
    changed[3] = 5.0
    with tg.no_grad():
        out = model(src, tgt, tgt_mask=_causal(4))
        out_changed = model(src, changed, tgt_mask=_causal(4))
    np.testing.assert_allclose(out[:3].numpy(), out_changed[:3].numpy(), rtol=1e-12)
    assert not np.allclose(out[3].numpy(), out_changed[3].numpy())


def test_submodule_names_and_initialization_follow_pytorch():
    model = nn.Transformer(8, 2, 2, 1, 16)
    names = list(model.state_dict())
    assert names[:4] == ["encoder.layers.0.self_attn.in_proj_weight", "encoder.layers.0.self_attn.in_proj_bias",
                         "encoder.layers.0.self_attn.out_proj.weight", "encoder.layers.0.self_attn.out_proj.bias"]
    assert "encoder.norm.weight" in names and "decoder.layers.0.multihead_attn.in_proj_weight" in names
    assert "decoder.layers.0.norm3.bias" in names and "decoder.layers.1.linear1.weight" not in names
    assert len(names) == 2 * 12 + 2 + 18 + 2  # two encoder layers, a norm; one decoder layer, a norm
    layers = model.encoder.layers
    assert layers[0].linear1.weight is not layers[1].linear1.weight  # deep copies
    bound = math.sqrt(6.0 / (16 + 8))  # Xavier-uniform of linear1 (16, 8)
    weight = layers[0].linear1.weight.detach().numpy()
    assert np.abs(weight).max() <= bound and np.abs(weight).max() > 0.8 * bound


def test_dropout_in_training_only():
    layer = nn.TransformerEncoderLayer(4, 2, 6, dropout=0.5).double()
    x = _randn(3, 2, 4, requires_grad=False)
    with tg.no_grad():
        tg.manual_seed(1)
        first = layer(x).numpy()
        second = layer(x).numpy()
        layer.eval()
        assert not np.allclose(first, second)
        np.testing.assert_array_equal(layer(x).numpy(), layer(x).numpy())


@pytest.mark.parametrize("module", ["encoder", "layer"])
def test_encoder_padding_mask_of_another_dtype_than_the_mask_warns_once_as_pytorch(module):
    layer = nn.TransformerEncoderLayer(4, 2, dim_feedforward=6, dropout=0.0, dtype=tg.float64)
    encoder = nn.TransformerEncoder(layer, 2) if module == "encoder" else layer
    mask_name = "mask" if module == "encoder" else "src_mask"
    x = tg.ones(3, 2, 4, dtype=tg.float64)
    padding = tg.tensor([[False, False, True], [False, False, False]])
    causal = nn.Transformer.generate_square_subsequent_mask(3, dtype=tg.float64)
    with pytest.warns(UserWarning, match=f"Support for mismatched src_key_padding_mask and {mask_name} ") as caught:
        encoder(x, causal, padding)
    assert len(caught) == 1, [str(w.message) for w in caught]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        encoder(x, causal == -math.inf, padding)


@pytest.mark.parametrize("call, message", [
    (lambda: nn.TransformerEncoderLayer(4, 2, activation="tanh"), "activation should be relu/gelu, not tanh"),
    (lambda: nn.Transformer(4, 2, 1, 1, 6)(tg.ones(3, 2, 4), tg.ones(2, 3, 4)), "the batch number of src and tgt"),
    (lambda: nn.Transformer(4, 2, 1, 1, 6)(tg.ones(3, 2, 4), tg.ones(2, 2, 5)),
     "the feature number of src and tgt must be equal to d_model"),
    (lambda: nn.TransformerEncoderLayer(4, 2)(tg.ones(3, 2, 4), is_causal=True),
     "Need attn_mask if specifying the is_causal hint"),
])
def test_bad_input_is_refused_with_pytorchs_message(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


@pytest.mark.parametrize("name", CASES)
@pytest.mark.filterwarnings("ignore:enable_nested_tensor is True")  # (PyTorch's, about its fast path)
def test_matches_torch_from_its_state_dict(name):
    torch = pytest.importorskip("torch")
    ours, theirs = _build(name), _build(name, torch)
    theirs.train()  # (PyTorch's inference fast path zeroes padded outputs; training with dropout 0 is exact)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: tg.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    arrays = [np.random.default_rng(40 + i).standard_normal(s) for i, s in enumerate(CASES[name][2])]
    tg_in = [tg.tensor(a, requires_grad=True) for a in arrays]
    torch_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    call = CASES[name][1]
    out = call(tg, ours, tg_in[0], tg_in[-1])
    expected = call(torch, theirs, torch_in[0], torch_in[-1])
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    theirs_params = dict(theirs.named_parameters())
    pairs = [(out, expected)] + [(a.grad, b.grad) for a, b in zip(tg_in, torch_in)]
    pairs += [(p.grad, theirs_params[n].grad) for n, p in ours.named_parameters()]
    for got, want in pairs:
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-9, atol=1e-11)
