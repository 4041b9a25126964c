"""W4: one SGD step (lr 0.01, no momentum) of an MLP 784-512-512-10 with ReLU on a batch
of 256: forward, mean cross-entropy, zero_grad, backward, parameter update.

Every library starts from the same float32 parameters (PyTorch's Linear initialization,
drawn with NumPy). A step returns the loss and the new parameters; the check compares the
loss and each parameter's update (new - old) with the float64 reference, since the
update is far smaller than the parameter itself. Timed calls keep training the same
model, which costs the same per step.
"""

from __future__ import annotations

import numpy as np
import reference
from workloads._libs import compiled_step, dispatch, jax_array, jax_ready, torch_tensor, tracegrad_tensor

CASES = {"W4-step": "W4 MLP 784-512-512-10 SGD step, batch 256"}
SIZES, SMOKE_SIZES = (784, 512, 512, 10), (32, 16, 16, 10)
BATCH, SMOKE_BATCH = 256, 8
LR = 0.01
PARAMS = reference.MLP_PARAMS


def make_inputs(case: str, smoke: bool) -> dict:
    rng = np.random.default_rng(4)
    sizes, batch = (SMOKE_SIZES, SMOKE_BATCH) if smoke else (SIZES, BATCH)
    inputs = {"x": rng.standard_normal((batch, sizes[0]), dtype=np.float32),
              "labels": rng.integers(0, sizes[-1], batch, dtype=np.int64)}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:]), start=1):
        bound = 1.0 / np.sqrt(fan_in)
        inputs[f"w{i}"] = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        inputs[f"b{i}"] = rng.uniform(-bound, bound, fan_out).astype(np.float32)
    return inputs


def reference_outputs(case: str, inputs: dict) -> dict:
    return reference.reference_mlp_sgd(inputs, LR)


def postprocess(outputs: dict, inputs: dict) -> dict:
    """Parameter updates (new - old) in float64, the quantity the reference gives."""
    result = {"loss": outputs["loss"]}
    for name in PARAMS:
        result[f"update_{name}"] = np.asarray(outputs[name], np.float64) - inputs[name].astype(np.float64)
    return result


def min_bytes(case: str, inputs: dict) -> None:
    return None  # matmul-bound: a byte count says little here


def build(peer: str, case: str, inputs: dict):
    # Each library gets private copies: the step updates its parameters in place.
    params = {k: inputs[k].copy() for k in PARAMS}
    return dispatch(peer, numpy=lambda: _numpy(inputs, params),
                    tracegrad=lambda compiled: _tracegrad(inputs, params, compiled),
                    torch=lambda compiled: _torch(inputs, params, compiled),
                    jax=lambda: _jax(inputs, params))


def _numpy(inputs: dict, p: dict):
    x, labels = inputs["x"], inputs["labels"]
    rows = np.arange(len(labels))

    def step():
        h1 = x @ p["w1"].T + p["b1"]
        r1 = np.maximum(h1, 0.0)
        h2 = r1 @ p["w2"].T + p["b2"]
        r2 = np.maximum(h2, 0.0)
        logits = r2 @ p["w3"].T + p["b3"]
        shifted = logits - logits.max(1, keepdims=True)
        exp = np.exp(shifted)
        total = exp.sum(1, keepdims=True)
        loss = (np.log(total[:, 0]) - shifted[rows, labels]).mean()
        g3 = exp / (total * len(labels))
        g3[rows, labels] -= 1.0 / len(labels)
        g2 = g3 @ p["w3"]
        g2 *= h2 > 0
        g1 = g2 @ p["w2"]
        g1 *= h1 > 0
        grads = {"w3": g3.T @ r2, "b3": g3.sum(0), "w2": g2.T @ r1, "b2": g2.sum(0),
                 "w1": g1.T @ x, "b1": g1.sum(0)}
        for name in PARAMS:
            p[name] -= LR * grads[name]
        return {"loss": loss, **p}
    return step


def _tracegrad(inputs: dict, p: dict, compiled: bool):
    import tracegrad as tg
    import tracegrad.nn.functional as F
    x, labels = tracegrad_tensor(inputs["x"]), tracegrad_tensor(inputs["labels"])
    layers = [tg.nn.Linear(1, 1) for _ in range(3)]
    for i, layer in enumerate(layers, start=1):
        layer.weight = tg.nn.Parameter(p[f"w{i}"])
        layer.bias = tg.nn.Parameter(p[f"b{i}"])
    model = tg.nn.Sequential(layers[0], tg.nn.ReLU(), layers[1], tg.nn.ReLU(), layers[2])
    opt = tg.optim.SGD(model.parameters(), lr=LR)

    def fn(x, labels):
        loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    fn = tg.compile(fn) if compiled else fn
    return compiled_step(lambda: _mlp_outputs(fn(x, labels), layers), fn if compiled else None)


def _torch(inputs: dict, p: dict, compiled: bool):
    import torch
    import torch.nn.functional as F
    x, labels = torch_tensor(inputs["x"]), torch_tensor(inputs["labels"])
    layers = [torch.nn.Linear(1, 1) for _ in range(3)]
    for i, layer in enumerate(layers, start=1):
        layer.weight = torch.nn.Parameter(torch_tensor(p[f"w{i}"]))
        layer.bias = torch.nn.Parameter(torch_tensor(p[f"b{i}"]))
    model = torch.nn.Sequential(layers[0], torch.nn.ReLU(), layers[1], torch.nn.ReLU(), layers[2])
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def fn(x, labels):
        loss = F.cross_entropy(model(x), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss
    fn = torch.compile(fn) if compiled else fn
    return lambda: _mlp_outputs(fn(x, labels), layers)


def _mlp_outputs(loss, layers) -> dict:
    out = {"loss": loss}
    for i, layer in enumerate(layers, start=1):
        out[f"w{i}"], out[f"b{i}"] = layer.weight, layer.bias
    return out


def _jax(inputs: dict, p: dict):
    import jax
    import jax.numpy as jnp
    x, labels = jax_array(inputs["x"]), jax_array(inputs["labels"].astype(np.int32))  # no x64 in jax
    state = {"params": {k: jax_array(v) for k, v in p.items()}}

    def loss_fn(params, x, labels):
        h = jax.nn.relu(x @ params["w1"].T + params["b1"])
        h = jax.nn.relu(h @ params["w2"].T + params["b2"])
        logp = jax.nn.log_softmax(h @ params["w3"].T + params["b3"], axis=1)
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    @jax.jit
    def sgd_step(params, x, labels):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, labels)
        return loss, jax.tree_util.tree_map(lambda w, g: w - LR * g, params, grads)

    def step():
        loss, state["params"] = sgd_step(state["params"], x, labels)
        return jax_ready({"loss": loss, **state["params"]})
    return step
