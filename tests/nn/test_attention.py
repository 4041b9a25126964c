"""`functional/attention.py` (scaled_dot_product_attention, multi_head_attention_forward)
and `nn/attention.py` (MultiheadAttention): gradients against finite differences (first and
second order, float64), compiled equal to eager, masks (bool, float, causal, key padding,
fully masked rows), PyTorch's parameter names, shapes, init and errors; compared with
PyTorch from the same state_dict where it is installed."""

import math
import warnings

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.autograd.gradcheck import gradcheck, gradgradcheck

F = nn.functional
CHECKS = [pytest.param(gradcheck, id="grad"), pytest.param(gradgradcheck, id="gradgrad")]


def _randn(*shape, seed=0, requires_grad=True):
    return tg.from_numpy(np.random.default_rng(seed).standard_normal(shape)).requires_grad_(requires_grad)


def _bool_mask(*shape, seed=3):
    mask = np.random.default_rng(seed).random(shape) > 0.4
    mask[..., 0] = True  # every query may attend to something
    return tg.from_numpy(mask)


# name -> (function of the functional module `m` and q, k, v, shapes of q, k, v); runs with
# tracegrad's and PyTorch's nn.functional.
SDPA_CASES = {
    "plain": (lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v), [(2, 3, 4), (2, 5, 4), (2, 5, 3)]),
    "causal": (lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, is_causal=True),
               [(1, 2, 4, 3), (1, 2, 4, 3), (1, 2, 4, 2)]),
    "scale": (lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, scale=0.3), [(3, 2), (4, 2), (4, 2)]),
    "gqa": (lambda m, q, k, v: m.scaled_dot_product_attention(q, k, v, enable_gqa=True),
            [(1, 4, 2, 2), (1, 2, 3, 2), (1, 2, 3, 2)]),
}


def _sdpa_inputs(shapes, seed=1):
    return [_randn(*s, seed=seed + i) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("name", SDPA_CASES)
def test_sdpa_gradients_match_finite_differences(name, check):
    fn, shapes = SDPA_CASES[name]
    assert check(lambda *xs: fn(F, *xs), tuple(_sdpa_inputs(shapes)))


@pytest.mark.parametrize("check", CHECKS)
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_sdpa_gradients_with_a_mask_match_finite_differences(kind, check):
    mask = _bool_mask(3, 4)
    if kind == "float":
        mask = _randn(3, 4, seed=8, requires_grad=False)
    assert check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask),
                 tuple(_sdpa_inputs([(2, 3, 2), (2, 4, 2), (2, 4, 2)])))


def test_sdpa_gradients_on_transposed_inputs():
    q = _randn(2, 3, seed=1).detach().t().requires_grad_()
    assert not q.is_contiguous()
    assert gradcheck(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), (q, _randn(4, 2), _randn(4, 2, seed=2)))


def test_sdpa_is_softmax_of_scaled_scores_times_values():
    q, k, v = (x.detach() for x in _sdpa_inputs([(3, 2), (4, 2), (4, 5)]))
    scores = q.numpy() @ k.numpy().T / math.sqrt(2)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v).numpy(), weights @ v.numpy(), rtol=1e-12)


@pytest.mark.parametrize("scale", [None, -0.7])
def test_sdpa_saves_scaled_query_and_key_so_they_may_be_updated_in_place_but_not_value(scale):
    """As PyTorch's math path: query and key are scaled before their product (a negative
    scale's sign on the query), so updating them in place before the backward changes no
    gradient; value is saved as it is (fuzz seeds 84821320 and 84821685 with PyTorch)."""
    def run(update):
        q, k, v = _sdpa_inputs([(3, 2), (4, 2), (4, 5)])
        q2, k2, v2 = q * 1, k * 1, v * 1
        out = F.scaled_dot_product_attention(q2, k2, v2, scale=scale, is_causal=True)
        with tg.no_grad():
            update(q2, k2, v2)
        out.pow(2).sum().backward()
        return [x.grad.numpy() for x in (q, k, v)]

    untouched = run(lambda q, k, v: None)
    for got, want in zip(run(lambda q, k, v: (q.mul_(3.0), k.add_(1.0))), untouched):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        run(lambda q, k, v: v.add_(1.0))
    factor = 1 / math.sqrt(2) if scale is None else scale
    q, k, v = (x.detach() for x in _sdpa_inputs([(3, 2), (4, 2), (4, 5)]))
    scores = (q.numpy() * -math.sqrt(abs(factor)) if factor < 0 else q.numpy() * math.sqrt(factor)) @ (
        k.numpy().T * math.sqrt(abs(factor)))
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, scale=scale).numpy(), weights @ v.numpy(),
                               rtol=1e-13)


def test_sdpa_bool_mask_true_means_attend_and_causal_is_the_lower_triangle():
    q, k, v = (x.detach() for x in _sdpa_inputs([(4, 2), (4, 2), (4, 3)]))
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    lower = F.scaled_dot_product_attention(q, k, v, attn_mask=tg.ones(4, 4, dtype=tg.bool).tril())
    additive = F.scaled_dot_product_attention(q, k, v, attn_mask=nn.Transformer.generate_square_subsequent_mask(
        4, dtype=tg.float64))
    np.testing.assert_allclose(causal.numpy(), lower.numpy(), rtol=1e-14)
    np.testing.assert_allclose(causal.numpy(), additive.numpy(), rtol=1e-14)
    np.testing.assert_allclose(causal[0].numpy(), v[0].numpy(), rtol=1e-14)  # the first sees only itself


def test_sdpa_row_with_every_key_masked_gives_zeros_and_zero_gradients():
    q, k, v = _sdpa_inputs([(2, 2), (3, 2), (3, 2)])
    mask = tg.tensor([[True, False, True], [False, False, False]])
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert out[1].tolist() == [0.0, 0.0] and np.isfinite(out.detach().numpy()).all()
    out.sum().backward()
    assert q.grad[1].tolist() == [0.0, 0.0]
    assert all(np.isfinite(x.grad.numpy()).all() for x in (q, k, v))


def test_sdpa_dropout_one_zeroes_every_weight_and_half_is_unbiased():
    q, k, v = (x.detach() for x in _sdpa_inputs([(2, 3), (4, 3), (4, 2)]))
    assert not F.scaled_dot_product_attention(q, k, v, dropout_p=1.0).numpy().any()
    tg.manual_seed(0)
    samples = np.stack([F.scaled_dot_product_attention(q, k, v, dropout_p=0.5).numpy() for _ in range(400)])
    np.testing.assert_allclose(samples.mean(0), F.scaled_dot_product_attention(q, k, v).numpy(), atol=0.15)


@pytest.mark.parametrize("call, message", [
    (lambda: F.scaled_dot_product_attention(tg.ones(2, 3), tg.ones(2, 3, dtype=tg.float64), tg.ones(2, 3)),
     "Expected query, key, and value to have the same dtype"),
    (lambda: F.scaled_dot_product_attention(tg.ones(2, 3), tg.ones(2, 4), tg.ones(2, 3)), "do not agree"),
    (lambda: F.scaled_dot_product_attention(tg.ones(2, 3), tg.ones(2, 3), tg.ones(2, 3), attn_mask=tg.ones(2, 2),
                                            is_causal=True), "Explicit attn_mask should not be set"),
    (lambda: F.scaled_dot_product_attention(tg.ones(3, 2, 3), tg.ones(2, 2, 3), tg.ones(2, 2, 3), enable_gqa=True),
     "must be a multiple"),
])
def test_sdpa_bad_input_is_refused(call, message):
    with pytest.raises(RuntimeError, match=message):
        call()


# --- MultiheadAttention ------------------------------------------------------------------------

def _mha(**kwargs):
    tg.manual_seed(0)
    return nn.MultiheadAttention(4, 2, **kwargs).double()


# name -> (module options, forward options, shapes of query, key, value)
MHA_CASES = {
    "self_attention": ({}, {}, None),
    "batch_first_key_padding": ({"batch_first": True}, {"key_padding_mask": "kpm"}, [(2, 3, 4), (2, 3, 4), (2, 3, 4)]),
    "kdim_vdim_bool_mask": ({"kdim": 3, "vdim": 2}, {"attn_mask": "bool"}, [(3, 2, 4), (3, 2, 3), (3, 2, 2)]),
    "bias_kv_zero_attn_float_mask": ({"add_bias_kv": True, "add_zero_attn": True},
                                     {"attn_mask": "float", "average_attn_weights": False},
                                     [(3, 2, 4), (3, 2, 4), (3, 2, 4)]),
    "no_weights_no_bias": ({"bias": False}, {"need_weights": False, "key_padding_mask": "kpm"},
                           [(3, 2, 4), (3, 2, 4), (3, 2, 4)]),
    "unbatched": ({}, {"attn_mask": "bool"}, [(3, 4), (3, 4), (3, 4)]),
}


def _mha_options(forward, batch=2, length=3, source=3):
    masks = {"kpm": tg.tensor([[False, True, False], [False, False, True]][:batch]),
             "bool": ~_bool_mask(length, source), "float": _randn(length, source, seed=8, requires_grad=False)}
    return {k: masks[v] if isinstance(v, str) else v for k, v in forward.items()}


def _mha_run(name):
    module_options, forward, shapes = MHA_CASES[name]
    module = _mha(**module_options)
    options = _mha_options(forward)
    if shapes is None:
        return module, (lambda x: tuple(o for o in module(x, x, x, **options) if o is not None)), [(3, 2, 4)]
    return module, (lambda q, k, v: tuple(o for o in module(q, k, v, **options) if o is not None)), shapes


@pytest.mark.parametrize("name", MHA_CASES)
def test_mha_gradients_of_inputs_and_parameters_match_finite_differences(name):
    module, run, shapes = _mha_run(name)
    inputs = [_randn(*s, seed=i + 1) for i, s in enumerate(shapes)]
    params = list(module.parameters())
    assert gradcheck(lambda *xs: run(*xs[:len(inputs)]), tuple(inputs + params))


@pytest.mark.parametrize("name", ["self_attention", "kdim_vdim_bool_mask", "no_weights_no_bias"])
def test_mha_second_order_gradients_match_finite_differences(name):
    _, run, shapes = _mha_run(name)
    assert gradgradcheck(run, tuple(_randn(*s, seed=i + 1) for i, s in enumerate(shapes)))


@pytest.mark.parametrize("name", MHA_CASES)
def test_mha_compiled_equals_eager(name):
    module, run, shapes = _mha_run(name)
    params = list(module.parameters())

    def step(*xs):
        outs = run(*xs)
        return outs, tg.autograd.grad(sum((o * o).sum() for o in outs), list(xs) + params)

    compiled = tg.compile(step)
    want_outs, want_grads = step(*[_randn(*s, seed=i + 1) for i, s in enumerate(shapes)])
    for _ in range(2):
        outs, grads = compiled(*[_randn(*s, seed=i + 1) for i, s in enumerate(shapes)])
        for got, want in zip(list(outs) + list(grads), list(want_outs) + list(want_grads)):
            np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-11, atol=1e-12)


def test_mha_parameters_follow_pytorch():
    packed = nn.MultiheadAttention(6, 3, add_bias_kv=True)
    assert [(n, p.shape) for n, p in packed.named_parameters()] == [
        ("in_proj_weight", (18, 6)), ("in_proj_bias", (18,)), ("bias_k", (1, 1, 6)), ("bias_v", (1, 1, 6)),
        ("out_proj.weight", (6, 6)), ("out_proj.bias", (6,))]
    separate = nn.MultiheadAttention(6, 3, kdim=4, vdim=5, bias=False)
    assert [(n, p.shape) for n, p in separate.named_parameters()] == [
        ("q_proj_weight", (6, 6)), ("k_proj_weight", (6, 4)), ("v_proj_weight", (6, 5)), ("out_proj.weight", (6, 6))]
    assert separate.in_proj_weight is None and packed.q_proj_weight is None
    assert not packed.in_proj_bias.detach().numpy().any() and not packed.out_proj.bias.detach().numpy().any()
    bound = math.sqrt(6.0 / (18 + 6))  # Xavier-uniform of the packed projection
    weights = packed.in_proj_weight.detach().numpy()
    assert np.abs(weights).max() <= bound and np.abs(weights).max() > 0.9 * bound


def test_mha_weights_are_a_distribution_over_keys_that_skips_padded_keys():
    module = _mha()
    x = _randn(3, 2, 4, requires_grad=False)
    padding = tg.tensor([[False, False, True], [False, False, False]])
    _, weights = module(x, x, x, key_padding_mask=padding)
    assert weights.shape == (2, 3, 3)
    np.testing.assert_allclose(weights.detach().numpy().sum(-1), np.ones((2, 3)), rtol=1e-12)
    assert not weights[0, :, 2].detach().numpy().any()
    _, per_head = module(x, x, x, key_padding_mask=padding, average_attn_weights=False)
    assert per_head.shape == (2, 2, 3, 3)


def test_mha_bool_and_float_masks_agree():
    module = _mha()
    x = _randn(3, 2, 4, requires_grad=False)
    blocked = ~_bool_mask(3, 3)
    additive = tg.zeros(3, 3, dtype=tg.float64).masked_fill(blocked, -math.inf)
    np.testing.assert_allclose(module(x, x, x, attn_mask=blocked)[0].detach().numpy(),
                               module(x, x, x, attn_mask=additive)[0].detach().numpy(), rtol=1e-14)


def test_mha_dropout_applies_in_training_only():
    module = _mha(dropout=1.0)
    x = _randn(3, 2, 4, requires_grad=False)
    out_train, weights = module(x, x, x)
    assert not weights.detach().numpy().any()
    np.testing.assert_allclose(out_train.detach().numpy(), np.broadcast_to(module.out_proj.bias.detach().numpy(),
                                                                           (3, 2, 4)))
    module.eval()
    assert module(x, x, x)[1].detach().numpy().sum() > 0


def test_mha_padding_mask_of_another_dtype_than_the_attention_mask_warns_as_pytorch():
    module, x = _mha(), _randn(3, 2, 4, requires_grad=False)
    padding = tg.tensor([[False, True, False], [False, False, True]])
    causal = nn.Transformer.generate_square_subsequent_mask(3, dtype=tg.float64)
    with pytest.warns(UserWarning, match="Support for mismatched key_padding_mask and attn_mask is deprecated"):
        mixed = module(x, x, x, key_padding_mask=padding, attn_mask=causal)[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        same = module(x, x, x, key_padding_mask=padding, attn_mask=causal == -math.inf)[0]
    np.testing.assert_allclose(mixed.detach().numpy(), same.detach().numpy(), rtol=1e-14)


@pytest.mark.parametrize("call, error, message", [
    (lambda: nn.MultiheadAttention(5, 2), AssertionError, "embed_dim must be divisible by num_heads"),
    (lambda: _mha()(tg.ones(2, 2, 2, 4, dtype=tg.float64), tg.ones(3, 4), tg.ones(3, 4)), AssertionError,
     "query should be unbatched 2D or batched 3D tensor"),
    (lambda: _mha()(tg.ones(3, 2, 4, dtype=tg.float64), tg.ones(3, 2, 4, dtype=tg.float64),
                    tg.ones(3, 2, 4, dtype=tg.float64), attn_mask=tg.ones(2, 3) > 0), RuntimeError,
     r"The shape of the 2D attn_mask is \(2, 3\), but should be \(3, 3\)"),
    (lambda: _mha()(tg.ones(3, 2, 4, dtype=tg.float64), tg.ones(3, 2, 4, dtype=tg.float64),
                    tg.ones(3, 2, 4, dtype=tg.float64), key_padding_mask=tg.ones(2, 4) > 0), AssertionError,
     r"expecting key_padding_mask shape of \(2, 3\)"),
    (lambda: _mha()(tg.ones(3, 2, 4, dtype=tg.float64), tg.ones(3, 2, 4, dtype=tg.float64),
                    tg.ones(3, 2, 4, dtype=tg.float64), is_causal=True), RuntimeError,
     "Need attn_mask if specifying the is_causal hint"),
    (lambda: _mha()(tg.ones(3, 2, 4, dtype=tg.float64), tg.ones(3, 2, 4, dtype=tg.float64),
                    tg.ones(3, 2, 4, dtype=tg.float64), attn_mask=tg.ones(3, 3, dtype=tg.int64)), AssertionError,
     "only bool and floating types of attn_mask are supported"),
])
def test_mha_bad_input_is_refused_with_pytorchs_message(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- PyTorch as the oracle ----------------------------------------------------------------------

@pytest.mark.parametrize("name", list(SDPA_CASES))
def test_sdpa_matches_torch(name):
    torch = pytest.importorskip("torch")
    fn, shapes = SDPA_CASES[name]
    arrays = [np.random.default_rng(20 + i).standard_normal(s) for i, s in enumerate(shapes)]
    ours = [tg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out, expected = fn(F, *ours), fn(torch.nn.functional, *theirs)
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("mask_kind", ["bool_with_empty_row", "float"])
def test_sdpa_with_masks_matches_torch(mask_kind):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    arrays = [rng.standard_normal(s) for s in [(2, 2, 3, 4), (2, 2, 5, 4), (2, 2, 5, 3)]]
    mask = rng.random((2, 1, 3, 5)) > 0.4
    mask[0, 0, 1] = False  # a query that may attend to nothing
    if mask_kind == "float":
        mask = rng.standard_normal((3, 5))
    ours = [tg.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = F.scaled_dot_product_attention(*ours, attn_mask=tg.tensor(mask))
    expected = torch.nn.functional.scaled_dot_product_attention(*theirs, attn_mask=torch.tensor(mask))
    np.testing.assert_allclose(out.detach().numpy(), expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    out.sum().backward()
    expected.sum().backward()
    for got, want in zip(ours, theirs):
        np.testing.assert_allclose(got.grad.numpy(), want.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", MHA_CASES)
def test_mha_matches_torch_from_its_state_dict(name):
    torch = pytest.importorskip("torch")
    module_options, forward, shapes = MHA_CASES[name]
    shapes = shapes or [(3, 2, 4)] * 3
    ours = _mha(**module_options)
    theirs = torch.nn.MultiheadAttention(4, 2, **module_options).double()
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict({k: tg.tensor(v.detach().numpy()) for k, v in theirs.state_dict().items()})
    options = _mha_options(forward)
    torch_options = {k: torch.tensor(v.numpy()) if isinstance(v, tg.Tensor) else v for k, v in options.items()}
    arrays = [np.random.default_rng(30 + i).standard_normal(s) for i, s in enumerate(shapes)]
    tg_in = [tg.tensor(a, requires_grad=True) for a in arrays]
    torch_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    tg_out = [o for o in ours(*tg_in, **options) if o is not None]
    torch_out = [o for o in theirs(*torch_in, **torch_options) if o is not None]
    sum((o * o).sum() for o in tg_out).backward()
    sum((o * o).sum() for o in torch_out).backward()
    pairs = list(zip(tg_out, torch_out)) + [(a.grad, b.grad) for a, b in zip(tg_in, torch_in)]
    theirs_params = dict(theirs.named_parameters())
    pairs += [(p.grad, theirs_params[n].grad) for n, p in ours.named_parameters()]
    for got, want in pairs:
        np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_size_zero_and_size_one_dims():
    assert F.scaled_dot_product_attention(tg.ones(0, 2), tg.ones(3, 2), tg.ones(3, 4)).shape == (0, 4)
    assert F.scaled_dot_product_attention(tg.ones(2, 0, 2), tg.ones(2, 0, 2), tg.ones(2, 0, 4)).shape == (2, 0, 4)
    one = F.scaled_dot_product_attention(tg.ones(1, 2), tg.ones(1, 2), tg.full((1, 3), 2.0))
    assert one.tolist() == [[2.0, 2.0, 2.0]]  # one key: all the weight on it
    module = nn.MultiheadAttention(4, 2)
    x = tg.ones(1, 1, 4)
    out, weights = module(x, x, x)
    assert out.shape == (1, 1, 4) and weights.tolist() == [[[1.0]]]
