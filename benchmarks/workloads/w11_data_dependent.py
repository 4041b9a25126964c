"""W11: a training step whose loop length depends on the model's own values.

A fixed-point RNN (as deep-equilibrium or "ponder" models iterate): u = inp(x), then
h <- tanh(u + rec(h)) from h = 0 until the largest change of h is below 1e-4
(`.item()` once per iteration decides whether to stop) or 50 iterations; the head's
cross-entropy is backpropagated through every iteration; SGD with momentum 0.9, lr 0.05.
Batch 32, 64 inputs, 256 hidden, 10 classes; `rec`'s weight starts as 0.8 times an
orthogonal matrix (a contraction), so each batch stops after a number of iterations of its
own. The step cycles through 4 batches. The iteration counts are compared with the
reference too, exactly (they are outputs of the check, beside the loss).
"""

from __future__ import annotations

import numpy as np
from workloads import _models

CASES = {"W11-fixedpoint": "W11 fixed-point RNN step, a .item() stop check per iteration (batch 32, 256 hidden)"}
PEERS = _models.LIBRARY_PEERS
CHECK_STEPS = _models.CHECK_STEPS
SIZES = {"batch": 32, "n_in": 64, "hidden": 256, "classes": 10}
SMOKE_SIZES = {"batch": 4, "n_in": 8, "hidden": 16, "classes": 3}
BATCHES, TOL, MAX_ITER, SCALE = 4, 1e-4, 50, 0.8
postprocess = _models.postprocess
check_floors = _models.check_floors


def program(torch):
    """The model class, for `torch` or `tracegrad as torch`."""
    nn = torch.nn

    class FixedPointRNN(nn.Module):
        def __init__(self, n_in, hidden, classes, tol, max_iter):
            super().__init__()
            self.inp = nn.Linear(n_in, hidden)
            self.rec = nn.Linear(hidden, hidden, bias=False)
            self.head = nn.Linear(hidden, classes)
            self.tol, self.max_iter = tol, max_iter

        def forward(self, x):
            u = self.inp(x)
            h = torch.zeros_like(u)
            iterations, converged = 0, False
            while not converged and iterations < self.max_iter:
                h_next = torch.tanh(u + self.rec(h))
                converged = (h_next - h).abs().max().item() < self.tol
                h = h_next
                iterations += 1
            return self.head(h), iterations

    return FixedPointRNN


def _sizes(inputs: dict) -> dict:
    return dict(SMOKE_SIZES if inputs["x"].shape[-1] == SMOKE_SIZES["n_in"] else SIZES)


def make_inputs(case: str, smoke: bool) -> dict:
    s = SMOKE_SIZES if smoke else SIZES
    rng = np.random.default_rng(11)
    return {"x": rng.standard_normal((BATCHES, s["batch"], s["n_in"]), dtype=np.float32),
            "labels": rng.integers(0, s["classes"], (BATCHES, s["batch"]), dtype=np.int64)}


def _initial_rec(hidden: int) -> np.ndarray:
    q, r = np.linalg.qr(np.random.default_rng(111).standard_normal((hidden, hidden)))
    return SCALE * q * np.sign(np.diag(r))


def iteration_counts(inputs: dict) -> list[int]:
    """The iterations each batch takes at the initial weights (float64 NumPy): the
    analytic GEMM count needs them."""
    s = _sizes(inputs)
    w_in = _models.parameter_array(11, "inp.weight", (s["hidden"], s["n_in"]))
    b_in = _models.parameter_array(11, "inp.bias", (s["hidden"],))
    w_rec = _initial_rec(s["hidden"])
    counts = []
    for x in inputs["x"].astype(np.float64):
        u = x @ w_in.T + b_in
        h = np.zeros_like(u)
        iterations, converged = 0, False
        while not converged and iterations < MAX_ITER:
            h_next = np.tanh(u + h @ w_rec.T)
            converged = np.abs(h_next - h).max() < TOL
            h = h_next
            iterations += 1
        counts.append(iterations)
    return counts


def gemms(case: str, inputs: dict) -> list:
    """inp and head once, rec once per iteration (iterations counted at the initial weights,
    the mean over the 4 batches), each with its backward products; x needs no gradient."""
    s = _sizes(inputs)
    iterations = round(float(np.mean(iteration_counts(inputs))))
    return (_models.linear_gemms(s["batch"], s["n_in"], s["hidden"], input_grad=False)
            + _models.linear_gemms(s["batch"], s["hidden"], s["hidden"], count=iterations)
            + _models.linear_gemms(s["batch"], s["hidden"], s["classes"]))


def parameter_count(inputs: dict) -> int:
    s = _sizes(inputs)
    return (s["n_in"] + 1) * s["hidden"] + s["hidden"] ** 2 + (s["hidden"] + 1) * s["classes"]


def min_bytes(case: str, inputs: dict) -> int:
    # SGD with momentum reads and writes the parameters and the momentum buffers
    return _models.state_bytes(parameter_count(inputs), 2, inputs["x"][0].nbytes + inputs["labels"][0].nbytes)


def make_model(torch, inputs: dict):
    s = _sizes(inputs)
    return program(torch)(s["n_in"], s["hidden"], s["classes"], TOL, MAX_ITER)


def build(peer: str, case: str, inputs: dict, dtype: str = "float32"):
    torch = _models.library(peer)
    F = torch.nn.functional
    s = _sizes(inputs)
    model = make_model(torch, inputs)
    if dtype == "float64":
        model = model.double()
    _models.load_parameters(torch, model, seed=11, overrides={"rec.weight": _initial_rec(s["hidden"])})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    batches = [(_models.float_inputs(torch, x, dtype), torch.from_numpy(labels))
               for x, labels in zip(inputs["x"], inputs["labels"])]

    def train_step(x, labels):
        logits, iterations = model(x)
        loss = F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss, iterations

    fn = _models.compile_step(torch, train_step, peer)
    state = {"i": 0}

    def step():
        x, labels = batches[state["i"] % len(batches)]
        state["i"] += 1
        loss, iterations = fn(x, labels)
        return {"loss": loss, "iterations": np.array(iterations)}
    step.compiled = fn if peer == "tracegrad-compiled" else None
    return step
