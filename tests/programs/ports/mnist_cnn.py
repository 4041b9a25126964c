"""A convolutional MNIST classifier: conv/relu/max_pool/dropout/log_softmax, nll_loss,
Adadelta with a StepLR schedule, a DataLoader over the training and test sets.

Source: pytorch/examples, mnist/main.py (commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch` (and its `nn`, `nn.functional`, `optim`); the MNIST
datasets are `TensorDataset`s of synthetic 28x28 digits (ten fixed random strokes images
plus noise, normalized as the original's transform does) from a NumPy generator; the
argparse settings are an `args` namespace in a reduced configuration (batch 16, 3 epochs
of 4 batches); the body of train's loop is `train_step` so it can be compiled, and train
returns its losses and step times; dropout is off (p=0, set from main) so runs compare.
"""

import time
from types import SimpleNamespace

import numpy as np

import tracegrad as torch
import tracegrad.nn as nn
import tracegrad.nn.functional as F
import tracegrad.optim as optim
import tracegrad.utils.data
from tracegrad.optim.lr_scheduler import StepLR

STEPS = 12
# Eager runs log_softmax and nll_loss as one op each with PyTorch's formulas, compiled code
# their fused composites: float32 rounding apart, which 12 Adadelta steps grow to 1.3e-4.
COMPILED_RTOL = 3e-4
TORCH_RTOL = 1e-3


class Net(nn.Module):
    def __init__(self):
        super(Net, self).__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
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


def train_step(model, optimizer, data, target):
    optimizer.zero_grad()
    output = model(data)
    loss = F.nll_loss(output, target)
    loss.backward()
    optimizer.step()
    return loss


def train(args, model, device, train_loader, optimizer, epoch, step, log):
    model.train()
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(device), target.to(device)
        start_time = time.perf_counter()
        loss = step(model, optimizer, data, target)
        log["losses"].append(loss.item())
        log["step_seconds"].append(time.perf_counter() - start_time)
        if batch_idx % args.log_interval == 0:
            log["printed"].append('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader), loss.item()))
            if args.dry_run:
                break


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction='sum').item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.dataset)

    return test_loss, correct / len(test_loader.dataset)


_templates = np.random.default_rng(0).random((10, 28, 28)) < 0.15


def synthetic_digits(rng, n):
    """n 28x28 grey images of the ten template 'digits' with pixel noise, and their labels,
    normalized with MNIST's mean and std as the original's transform does."""
    labels = rng.integers(0, 10, n)
    images = np.clip(_templates[labels] * 0.9 + rng.random((n, 28, 28)) * 0.4, 0, 1)
    images = (images - 0.1307) / 0.3081
    return (torch.tensor(images[:, None].astype(np.float32)), torch.tensor(labels))


def main(steps=STEPS, compiled=False, init=None):
    args = SimpleNamespace(batch_size=16, test_batch_size=64, epochs=3, lr=1.0, gamma=0.7,
                           log_interval=2, dry_run=False, seed=1)

    torch.manual_seed(args.seed)

    device = torch.device("cpu")
    train_kwargs = {'batch_size': args.batch_size}
    test_kwargs = {'batch_size': args.test_batch_size}

    rng = np.random.default_rng(1)
    per_epoch = -(-steps // args.epochs)
    dataset1 = torch.utils.data.TensorDataset(*synthetic_digits(rng, per_epoch * args.batch_size))
    dataset2 = torch.utils.data.TensorDataset(*synthetic_digits(rng, 128))
    train_loader = torch.utils.data.DataLoader(dataset1,**train_kwargs)
    test_loader = torch.utils.data.DataLoader(dataset2, **test_kwargs)

    model = Net().to(device)
    model.dropout1.p = model.dropout2.p = 0.0
    if init is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    step = torch.compile(train_step) if compiled else train_step
    log = {"losses": [], "step_seconds": [], "printed": [], "tests": []}
    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train(args, model, device, train_loader, optimizer, epoch, step, log)
        log["tests"].append(test(model, device, test_loader))
        scheduler.step()
    return {**log, "init": start, "lr": optimizer.param_groups[0]["lr"]}


def check(result):
    losses = result["losses"]
    assert len(losses) == STEPS, losses
    assert np.mean(losses[-3:]) < losses[0] / 4, losses
    test_loss, accuracy = result["tests"][-1]
    assert accuracy >= 0.75, result["tests"]
    assert test_loss < result["tests"][0][0], result["tests"]
    assert abs(result["lr"] - 1.0 * 0.7 ** 3) < 1e-9, result["lr"]
    assert result["printed"][0].startswith("Train Epoch: 1 [0/64 (0%)]\tLoss: "), result["printed"]
