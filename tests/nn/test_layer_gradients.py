"""Every layer and loss, differentiated: gradients against finite differences (float64,
through `Module.double()`), and a compiled run (forward, and gradients with respect to the
input and every parameter via `tg.autograd.grad`) equal to the eager run.

A case is (name, module factory, input factory); the factories run after `manual_seed(0)`,
so two calls build identical modules and inputs. Inputs that require grad are floating.
"""

import numpy as np
import pytest

import tracegrad as tg
from tracegrad import nn
from tracegrad.autograd.gradcheck import gradcheck


def _float(*shape):
    return tg.randn(*shape, dtype=tg.float64).requires_grad_()


def _distinct(*shape):
    """Values far apart from each other (max pooling's gradient is defined without ties)."""
    n = int(np.prod(shape))
    values = (np.random.default_rng(5).permutation(n) - n / 2 + 0.5) / n * 4.0  # none is 0
    return tg.from_numpy(values.reshape(shape)).requires_grad_()


def _labels(n, classes):
    return tg.randint(0, classes, (n,))


def _targets(*shape):
    return tg.rand(*shape, dtype=tg.float64)


class Seeded(nn.Module):
    """Draws its random numbers from a fixed seed on every call (Dropout, comparably)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        tg.manual_seed(123)
        return self.inner(x)


CASES = [
    ("linear", lambda: nn.Linear(4, 3), lambda: [_float(2, 4)]),
    ("linear_no_bias", lambda: nn.Linear(4, 3, bias=False), lambda: [_float(2, 4)]),
    ("conv2d", lambda: nn.Conv2d(2, 3, 3), lambda: [_float(2, 2, 5, 5)]),
    ("conv2d_stride_padding", lambda: nn.Conv2d(2, 3, 3, stride=2, padding=1), lambda: [_float(1, 2, 5, 6)]),
    ("conv2d_dilation_groups", lambda: nn.Conv2d(4, 2, (2, 3), padding=(1, 2), dilation=(2, 1), groups=2,
                                                 bias=False), lambda: [_float(1, 4, 4, 4)]),
    ("conv2d_padding_same", lambda: nn.Conv2d(1, 2, 4, padding="same"), lambda: [_float(1, 1, 4, 5)]),
    ("max_pool2d", lambda: nn.MaxPool2d(2), lambda: [_distinct(2, 2, 4, 4)]),
    ("max_pool2d_overlapping_padded", lambda: nn.MaxPool2d(3, stride=2, padding=1),
     lambda: [_distinct(1, 2, 5, 5)]),
    ("avg_pool2d", lambda: nn.AvgPool2d(2), lambda: [_float(2, 2, 4, 4)]),
    ("avg_pool2d_padding_excluded", lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
     lambda: [_float(1, 2, 5, 5)]),
    ("flatten", lambda: nn.Flatten(), lambda: [_float(2, 3, 2)]),
    ("dropout", lambda: Seeded(nn.Dropout(0.3)), lambda: [_float(4, 5)]),
    ("embedding", lambda: nn.Embedding(6, 3), lambda: [tg.tensor([[0, 2, 5], [2, 2, 1]])]),
    ("layer_norm", lambda: nn.LayerNorm(4), lambda: [_float(3, 4)]),
    ("layer_norm_2d_shape", lambda: nn.LayerNorm((2, 3)), lambda: [_float(2, 2, 3)]),
    ("batch_norm1d_train", lambda: nn.BatchNorm1d(3), lambda: [_float(4, 3)]),
    ("batch_norm1d_train_3d", lambda: nn.BatchNorm1d(3), lambda: [_float(2, 3, 4)]),
    ("batch_norm2d_train", lambda: nn.BatchNorm2d(2), lambda: [_float(2, 2, 3, 3)]),
    ("batch_norm2d_eval", lambda: nn.BatchNorm2d(2).eval(), lambda: [_float(2, 2, 3, 3)]),
    ("batch_norm2d_no_affine", lambda: nn.BatchNorm2d(2, affine=False), lambda: [_float(2, 2, 2, 2)]),
    ("relu", lambda: nn.ReLU(), lambda: [_distinct(3, 4)]),
    ("gelu", lambda: nn.GELU(), lambda: [_float(3, 4)]),
    ("gelu_tanh", lambda: nn.GELU(approximate="tanh"), lambda: [_float(3, 4)]),
    ("tanh", lambda: nn.Tanh(), lambda: [_float(3, 4)]),
    ("sigmoid", lambda: nn.Sigmoid(), lambda: [_float(3, 4)]),
    ("softmax", lambda: nn.Softmax(dim=1), lambda: [_float(3, 4)]),
    ("sequential_cnn", lambda: nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.BatchNorm2d(2), nn.ReLU(),
                                             nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8, 3)),
     lambda: [_float(2, 1, 4, 4)]),
    ("module_list", lambda: _Stack(), lambda: [_float(2, 3)]),
    ("cross_entropy_loss", lambda: nn.CrossEntropyLoss(), lambda: [_float(4, 5), _labels(4, 5)]),
    ("cross_entropy_loss_sum", lambda: nn.CrossEntropyLoss(reduction="sum"), lambda: [_float(4, 5), _labels(4, 5)]),
    ("mse_loss", lambda: nn.MSELoss(), lambda: [_float(3, 4), _float(3, 4)]),
    ("mse_loss_none", lambda: nn.MSELoss(reduction="none"), lambda: [_float(3, 4), _float(3, 4)]),
    ("bce_with_logits_loss", lambda: nn.BCEWithLogitsLoss(), lambda: [_float(3, 4), _targets(3, 4)]),
    ("bce_with_logits_loss_pos_weight", lambda: nn.BCEWithLogitsLoss(
        pos_weight=tg.tensor([1.0, 2.0, 0.5, 3.0], dtype=tg.float64), reduction="sum"),
     lambda: [_float(3, 4), _targets(3, 4)]),
]

# The padding row deliberately gets no gradient, which finite differences cannot know.
NOT_GRADCHECKED = [
    ("embedding_padding_idx", lambda: nn.Embedding(6, 3, padding_idx=2), lambda: [tg.tensor([0, 2, 5, 2])]),
]


class _Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2)])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def _build(make_module, make_inputs):
    tg.manual_seed(0)
    module = make_module().double()
    inputs = make_inputs()
    return module, inputs


@pytest.mark.parametrize("name, make_module, make_inputs", CASES, ids=[c[0] for c in CASES])
def test_gradients_match_finite_differences(name, make_module, make_inputs):
    module, inputs = _build(make_module, make_inputs)
    n_inputs = len(inputs)
    # gradcheck perturbs the tensors it is given in place, so also the module's parameters.
    assert gradcheck(lambda *args: module(*args[:n_inputs]), inputs + list(module.parameters()),
                     atol=1e-6, rtol=1e-4)


def _forward_and_grads(module, inputs, weight):
    """The output and d(sum(output * weight)) / d(inputs and parameters)."""
    def run(weight, *tensors):
        out = module(*tensors[:len(inputs)])
        loss = (out * weight).sum()
        return [out, *tg.autograd.grad(loss, [t for t in tensors if t.requires_grad])]
    return run


@pytest.mark.parametrize("name, make_module, make_inputs", CASES + NOT_GRADCHECKED,
                         ids=[c[0] for c in CASES + NOT_GRADCHECKED])
def test_compiled_forward_and_gradients_match_eager(name, make_module, make_inputs):
    results = []
    for compiled in (False, True):
        module, inputs = _build(make_module, make_inputs)
        with tg.no_grad():
            shape = module(*inputs).shape
        weight = tg.from_numpy(np.random.default_rng(9).uniform(0.5, 1.5, shape))
        run = _forward_and_grads(module, inputs, weight)
        # Parameters are passed as arguments so that autograd.grad can name them.
        args = [weight, *inputs, *module.parameters()]
        results.append((tg.compile(run) if compiled else run)(*args))
    eager, compiled = results
    assert len(eager) == len(compiled)
    for e, c in zip(eager, compiled):
        np.testing.assert_allclose(c.detach().numpy(), e.detach().numpy(), rtol=1e-10, atol=1e-12)
