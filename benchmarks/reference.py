"""Float64 NumPy references for every workload, and the float32 tolerance check.

Each `reference_*` function takes the workload's float32 inputs (a dict of arrays),
computes in float64 with the plain textbook formulas, and returns a dict with the same
keys a peer's step returns. `check` compares a peer's outputs against it and raises
`Mismatch` (with the worst element of every failing output) when they disagree.

Tolerance, suited to float32 arithmetic on inputs of order 1:
|out - ref| <= RTOL * |ref| + ATOL * max|ref|, per output, with RTOL = 1e-3 and
ATOL = 1e-4. The second term scales with the output's magnitude, so gradients that are
tiny everywhere (cross-entropy divides by the batch size) are judged relative to their
own scale rather than to 1.
"""

from __future__ import annotations

import math

import numpy as np

RTOL = 1e-3
ATOL = 1e-4
GELU_C = math.sqrt(2.0 / math.pi)
GELU_A = 0.044715


class Mismatch(AssertionError):
    """A peer's result differs from the float64 reference beyond the float32 tolerance."""


def _f64(inputs: dict) -> dict:
    return {k: np.asarray(v, dtype=np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
            for k, v in inputs.items()}


def reference_bias_gelu(inputs: dict, backward: bool = True) -> dict:
    """W1: loss = sum(gelu_tanh(x * w + b)); grads of x, w, b (w, b broadcast over rows)."""
    a = _f64(inputs)
    x, w, b = a["x"], a["w"], a["b"]
    z = x * w + b
    t = np.tanh(GELU_C * (z + GELU_A * z ** 3))
    out = {"loss": np.array((0.5 * z * (1.0 + t)).sum())}
    if backward:
        dz = 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * GELU_A * z * z)
        out.update(grad_x=dz * w, grad_w=(dz * x).sum(0), grad_b=dz.sum(0))
    return out


def reference_layer_norm(inputs: dict, eps: float = 1e-5) -> dict:
    """W2: y = layer_norm(x) * gamma + beta over the last axis, loss = sum(y * y)."""
    a = _f64(inputs)
    x, gamma, beta = a["x"], a["gamma"], a["beta"]
    n = x.shape[-1]
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    xhat = (x - mean) / np.sqrt(var + eps)
    y = xhat * gamma + beta
    dy = 2.0 * y
    dxhat = dy * gamma
    grad_x = (n * dxhat - dxhat.sum(-1, keepdims=True) - xhat * (dxhat * xhat).sum(-1, keepdims=True))
    grad_x /= n * np.sqrt(var + eps)
    return {"loss": np.array((y * y).sum()), "grad_x": grad_x,
            "grad_gamma": (dy * xhat).sum(0), "grad_beta": dy.sum(0)}


def _softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(1, keepdims=True)
    logsumexp = np.log(np.exp(shifted).sum(1, keepdims=True))
    logp = shifted - logsumexp
    rows = np.arange(len(labels))
    loss = -logp[rows, labels].mean()
    grad = np.exp(logp)
    grad[rows, labels] -= 1.0
    return np.array(loss), grad / len(labels)


def reference_cross_entropy(inputs: dict) -> dict:
    """W3: mean softmax cross-entropy of logits against integer labels."""
    a = _f64(inputs)
    loss, grad = _softmax_cross_entropy(a["logits"], a["labels"])
    return {"loss": loss, "grad_logits": grad}


MLP_PARAMS = ("w1", "b1", "w2", "b2", "w3", "b3")


def reference_mlp_sgd(inputs: dict, lr: float) -> dict:
    """W4: loss and the parameter updates (new - old) of one SGD step of a ReLU MLP."""
    a = _f64(inputs)
    x = a["x"]
    h1 = x @ a["w1"].T + a["b1"]
    r1 = np.maximum(h1, 0.0)
    h2 = r1 @ a["w2"].T + a["b2"]
    r2 = np.maximum(h2, 0.0)
    logits = r2 @ a["w3"].T + a["b3"]
    loss, g3 = _softmax_cross_entropy(logits, a["labels"])
    g2 = (g3 @ a["w3"]) * (h2 > 0)
    g1 = (g2 @ a["w2"]) * (h1 > 0)
    grads = {"w3": g3.T @ r2, "b3": g3.sum(0), "w2": g2.T @ r1, "b2": g2.sum(0),
             "w1": g1.T @ x, "b1": g1.sum(0)}
    out = {"loss": loss}
    out.update({f"update_{k}": -lr * grads[k] for k in MLP_PARAMS})
    return out


def reference_small_chain(inputs: dict) -> dict:
    """W5: the ten-op chain of workloads/w5_small_chain.py, summed, and its gradient."""
    x = _f64(inputs)["x"]
    v1 = x * 1.5
    v2 = v1 + 0.25
    v3 = np.sin(v2)
    v4 = v3 * x
    v5 = np.exp(v4)
    v6 = v5 - 1.0
    v7 = np.tanh(v6)
    v8 = v7 * v7
    v9 = 1.0 / (1.0 + np.exp(-v8))
    v10 = v9 / 2.0
    d9 = np.full_like(x, 0.5)
    d8 = d9 * v9 * (1.0 - v9)
    d7 = d8 * 2.0 * v7
    d6 = d7 * (1.0 - v7 * v7)
    d4 = d6 * v5
    dx = d4 * v3 + np.cos(v2) * 1.5 * d4 * x
    return {"loss": np.array(v10.sum()), "grad_x": dx}


def check(outputs: dict, reference: dict, label: str = "", against: str = "the float64 reference",
          floors: dict[str, float] | None = None) -> None:
    """Raise `Mismatch` unless every reference output is present and within tolerance;
    `floors` adds an absolute term to some outputs' tolerance (a difference of float32 values
    cannot be more precise than their own rounding)."""
    floors = floors or {}
    missing = sorted(set(reference) - set(outputs))
    if missing:
        raise Mismatch(f"{label}: missing outputs {missing}")
    problems = []
    for name, ref in reference.items():
        out = np.asarray(outputs[name], dtype=np.float64)
        if out.shape != ref.shape:
            problems.append(f"{name}: shape {out.shape}, expected {ref.shape}")
            continue
        if not np.all(np.isfinite(out)):
            problems.append(f"{name}: {int((~np.isfinite(out)).sum())} non-finite values")
            continue
        error = np.abs(out - ref)
        allowed = RTOL * np.abs(ref) + ATOL * float(np.abs(ref).max(initial=0.0)) + floors.get(name, 0.0)
        bad = error > allowed
        if bad.any():
            worst = np.unravel_index(int(np.argmax(error - allowed)), error.shape) if error.ndim else ()
            problems.append(f"{name}: {int(bad.sum())}/{bad.size} elements off; worst at {worst}: "
                            f"got {out[worst]!r}, expected {ref[worst]!r} (max |ref| "
                            f"{float(np.abs(ref).max()):.3g})")
    if problems:
        raise Mismatch(f"{label}: result differs from {against}:\n  " + "\n  ".join(problems))
