"""W3: mean softmax cross-entropy of (8192, 1000) float32 logits against int64 labels;
forward+backward (the loss and the gradient of the logits).

Minimum traffic of a fully fused implementation: read the logits and labels once, write
the logits' gradient once.
"""

from __future__ import annotations

import numpy as np
import reference
from workloads._libs import compiled_step, dispatch, jax_array, jax_ready, torch_tensor, tracegrad_tensor

CASES = {"W3-fwdbwd": "W3 softmax cross-entropy (8192x1000), forward+backward"}
SHAPE, SMOKE_SHAPE = (8192, 1000), (64, 100)


def make_inputs(case: str, smoke: bool) -> dict:
    rng = np.random.default_rng(3)
    rows, classes = SMOKE_SHAPE if smoke else SHAPE
    return {"logits": (rng.standard_normal((rows, classes), dtype=np.float32) * 3.0).astype(np.float32),
            "labels": rng.integers(0, classes, rows, dtype=np.int64)}


def reference_outputs(case: str, inputs: dict) -> dict:
    return reference.reference_cross_entropy(inputs)


def min_bytes(case: str, inputs: dict) -> int:
    return 2 * inputs["logits"].nbytes + inputs["labels"].nbytes


def build(peer: str, case: str, inputs: dict):
    return dispatch(peer, numpy=lambda: _numpy(inputs),
                    tracegrad=lambda compiled: _tracegrad(inputs, compiled),
                    torch=lambda compiled: _torch(inputs, compiled),
                    jax=lambda: _jax(inputs))


def _numpy(inputs: dict):
    logits, labels = inputs["logits"], inputs["labels"]
    rows = np.arange(len(labels))

    def step():
        shifted = logits - logits.max(1, keepdims=True)
        exp = np.exp(shifted)
        total = exp.sum(1, keepdims=True)
        loss = (np.log(total[:, 0]) - shifted[rows, labels]).mean()
        grad = exp / (total * len(labels))
        grad[rows, labels] -= 1.0 / len(labels)
        return {"loss": loss, "grad_logits": grad}
    return step


def _tracegrad(inputs: dict, compiled: bool):
    import tracegrad as tg
    import tracegrad.nn.functional as F
    logits, labels = tracegrad_tensor(inputs["logits"], True), tracegrad_tensor(inputs["labels"])

    def fn(logits, labels):
        loss = F.cross_entropy(logits, labels)
        (grad,) = tg.autograd.grad(loss, [logits])
        return {"loss": loss, "grad_logits": grad}
    fn = tg.compile(fn) if compiled else fn
    return compiled_step(lambda: fn(logits, labels), fn if compiled else None)


def _torch(inputs: dict, compiled: bool):
    import torch
    import torch.nn.functional as F
    logits, labels = torch_tensor(inputs["logits"], True), torch_tensor(inputs["labels"])

    def fn(logits, labels):
        loss = F.cross_entropy(logits, labels)
        (grad,) = torch.autograd.grad(loss, [logits])
        return {"loss": loss, "grad_logits": grad}
    fn = torch.compile(fn) if compiled else fn
    return lambda: fn(logits, labels)


def _jax(inputs: dict):
    import jax
    import jax.numpy as jnp
    logits, labels = jax_array(inputs["logits"]), jax_array(inputs["labels"].astype(np.int32))  # no x64 in jax

    def loss_fn(logits, labels):
        logp = jax.nn.log_softmax(logits, axis=1)
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()
    value_and_grad = jax.jit(jax.value_and_grad(loss_fn))

    def step():
        loss, grad = value_and_grad(logits, labels)
        return jax_ready({"loss": loss, "grad_logits": grad})
    return step
