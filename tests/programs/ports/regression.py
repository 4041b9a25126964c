"""Polynomial regression with a linear layer and a hand-written SGD update.

Source: pytorch/examples, regression/main.py (commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch`; the random data (torch.randn) comes from a NumPy
generator; the loop runs a given number of steps (the original stops at loss < 1e-3) and its
step is a function so it can be compiled; the prints are kept as `describe`.
"""

import time
from itertools import count

import numpy as np

import tracegrad as torch
import tracegrad.nn.functional as F

POLY_DEGREE = 4
STEPS = 60
COMPILED_RTOL = 1e-5
TORCH_RTOL = 1e-4

_rng = np.random.default_rng(0)
W_target = torch.tensor(_rng.standard_normal((POLY_DEGREE, 1)), dtype=torch.float32) * 5
b_target = torch.tensor(_rng.standard_normal(1), dtype=torch.float32) * 5


def make_features(x):
    """Builds features i.e. a matrix with columns [x, x^2, x^3, x^4]."""
    x = x.unsqueeze(1)
    return torch.cat([x ** i for i in range(1, POLY_DEGREE+1)], 1)


def f(x):
    """Approximated function."""
    return x.mm(W_target) + b_target.item()


def poly_desc(W, b):
    """Creates a string description of a polynomial."""
    result = 'y = '
    for i, w in enumerate(W):
        result += '{:+.2f} x^{} '.format(w, i + 1)
    result += '{:+.2f}'.format(b[0])
    return result


def get_batch(rng, batch_size=32):
    """Builds a batch i.e. (x, f(x)) pair."""
    random = torch.tensor(rng.standard_normal(batch_size), dtype=torch.float32)
    x = make_features(random)
    y = f(x)
    return x, y


def main(steps=STEPS, compiled=False, init=None):
    fc = torch.nn.Linear(W_target.size(0), 1)
    if init is not None:
        fc.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in fc.state_dict().items()}

    def train_step(batch_x, batch_y):
        # Reset gradients
        fc.zero_grad()

        # Forward pass
        output = F.smooth_l1_loss(fc(batch_x), batch_y)

        # Backward pass
        output.backward()

        # Apply gradients
        for param in fc.parameters():
            param.data.add_(-0.1 * param.grad)
        return output

    step = torch.compile(train_step) if compiled else train_step
    rng = np.random.default_rng(1)
    losses, seconds = [], []
    for batch_idx in count(1):
        # Get data
        batch_x, batch_y = get_batch(rng)
        start_time = time.perf_counter()
        losses.append(step(batch_x, batch_y).item())
        seconds.append(time.perf_counter() - start_time)
        if batch_idx == steps:
            break
    return {"losses": losses, "init": start, "step_seconds": seconds, "describe": (
        '==> Learned function:\t' + poly_desc(fc.weight.view(-1), fc.bias) + '\n'
        '==> Actual function:\t' + poly_desc(W_target.view(-1), b_target))}


def check(result):
    losses = result["losses"]
    assert losses[-1] < losses[0] / 10, losses
    assert "==> Learned function:\ty = " in result["describe"]
