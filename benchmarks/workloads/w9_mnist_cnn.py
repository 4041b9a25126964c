"""W9: a training step of pytorch/examples' MNIST CNN (mnist/main.py: Net and train's loop
body), fed by a DataLoader.

conv 1->32 3x3, ReLU, conv 32->64 3x3, ReLU, 2x2 max_pool2d, dropout, flatten, linear
9216->128, ReLU, dropout, linear 128->10, log_softmax; `F.nll_loss`; Adadelta (lr 1.0, the
example's default). One step takes the next batch of 64 from a `DataLoader` over a
`TensorDataset` of 640 synthetic 28x28 images (shuffle off, so both libraries see the same
batches; the loader starts over when it runs out) and runs zero_grad, forward, backward and
the update. The dropout layers are the example's but with p=0: the libraries draw
different masks, and the check compares the two runs step by step.
"""

from __future__ import annotations

import numpy as np
from workloads import _models

CASES = {"W9-mnist": "W9 MNIST CNN step (pytorch/examples, batch 64, DataLoader, Adadelta)"}
PEERS = _models.LIBRARY_PEERS
CHECK_STEPS = _models.CHECK_STEPS
SIZES = {"image": 28, "batch": 64, "batches": 10}
SMOKE_SIZES = {"image": 10, "batch": 4, "batches": 3}
postprocess = _models.postprocess
check_floors = _models.check_floors


def _pooled(image: int) -> int:
    """Side of the feature map after two valid 3x3 convolutions and a 2x2 pool."""
    return (image - 4) // 2


def program(torch):
    """The model class, for `torch` or `tracegrad as torch`."""
    nn = torch.nn
    F = torch.nn.functional

    class Net(nn.Module):
        def __init__(self, image=28):
            super().__init__()
            self.conv1 = nn.Conv2d(1, 32, 3, 1)
            self.conv2 = nn.Conv2d(32, 64, 3, 1)
            self.dropout1 = nn.Dropout(0.0)
            self.dropout2 = nn.Dropout(0.0)
            self.fc1 = nn.Linear(64 * _pooled(image) ** 2, 128)  # 9216 for 28x28
            self.fc2 = nn.Linear(128, 10)

        def forward(self, x):
            x = self.conv1(x)
            x = F.relu(x)
            x = self.conv2(x)
            x = F.relu(x)
            x = F.max_pool2d(x, 2)
            x = self.dropout1(x)
            x = torch.flatten(x, 1)
            x = self.fc1(x)
            x = F.relu(x)
            x = self.dropout2(x)
            x = self.fc2(x)
            output = F.log_softmax(x, dim=1)
            return output

    return Net


def _sizes(inputs: dict) -> dict:
    image = inputs["images"].shape[-1]
    return dict(SMOKE_SIZES if image == SMOKE_SIZES["image"] else SIZES)


def make_inputs(case: str, smoke: bool) -> dict:
    s = SMOKE_SIZES if smoke else SIZES
    rng = np.random.default_rng(9)
    n = s["batch"] * s["batches"]
    return {"images": rng.standard_normal((n, 1, s["image"], s["image"]), dtype=np.float32),
            "labels": rng.integers(0, 10, n, dtype=np.int64)}


def gemms(case: str, inputs: dict) -> list:
    """Convolutions counted as their im2col products: conv1 on batch*26*26 rows of 1*3*3
    (forward and weight gradient; the images need no gradient), conv2 on batch*24*24 rows of
    32*3*3 (forward, weight and input gradients); fc1 and fc2."""
    s = _sizes(inputs)
    b, side1 = s["batch"], s["image"] - 2
    side2 = side1 - 2
    return (_models.linear_gemms(b * side1 * side1, 9, 32, input_grad=False)
            + _models.linear_gemms(b * side2 * side2, 32 * 9, 64)
            + _models.linear_gemms(b, 64 * _pooled(s["image"]) ** 2, 128)
            + _models.linear_gemms(b, 128, 10))


def parameter_count(inputs: dict) -> int:
    s = _sizes(inputs)
    return (32 * 9 + 32) + (64 * 32 * 9 + 64) + (64 * _pooled(s["image"]) ** 2 * 128 + 128) + (128 * 10 + 10)


def min_bytes(case: str, inputs: dict) -> int:
    s = _sizes(inputs)
    batch_bytes = s["batch"] * (s["image"] ** 2 * 4 + 8)
    # Adadelta reads and writes the parameters, square_avg and acc_delta
    return _models.state_bytes(parameter_count(inputs), 3, batch_bytes)


def make_model(torch, inputs: dict):
    return program(torch)(_sizes(inputs)["image"])


def build(peer: str, case: str, inputs: dict, dtype: str = "float32"):
    torch = _models.library(peer)
    F = torch.nn.functional
    s = _sizes(inputs)
    model = make_model(torch, inputs)
    if dtype == "float64":
        model = model.double()
    _models.load_parameters(torch, model, seed=9)
    model.train()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    dataset = torch.utils.data.TensorDataset(_models.float_inputs(torch, inputs["images"], dtype),
                                             torch.from_numpy(inputs["labels"]))
    train_loader = torch.utils.data.DataLoader(dataset, batch_size=s["batch"], shuffle=False)

    def train_step(data, target):
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        return loss

    fn = _models.compile_step(torch, train_step, peer)
    state = {"batches": iter(train_loader)}

    def step():
        batch = next(state["batches"], None)
        if batch is None:  # an epoch ended: start the loader over
            state["batches"] = iter(train_loader)
            batch = next(state["batches"])
        data, target = batch
        return {"loss": fn(data, target)}
    step.compiled = fn if peer == "tracegrad-compiled" else None
    return step
