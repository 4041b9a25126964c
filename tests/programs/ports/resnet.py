"""A residual network for CIFAR-10 (He et al. 2015, section 4.2): 3x3 convolutions with
BatchNorm2d and in-place ReLU, residual blocks with a downsampling shortcut, average pooling,
cross-entropy, Adam, and the learning rate divided by 3 every few epochs.

Source: yunjey/pytorch-tutorial, tutorials/02-intermediate/deep_residual_network/main.py
(commit 0500d3d, 2020-07-06).
Ported: `import tracegrad as torch` (and its `nn`); the CIFAR-10 datasets are
`TensorDataset`s of synthetic 3x32x32 images (ten fixed random colour patterns plus noise)
from a NumPy generator, without the random pad/flip/crop augmentation; the hyper-parameters
are reduced (batch 8, 4 epochs of 3 batches, the rate decayed every 2 epochs instead of 20);
the body of the training loop is `train_step` so it can be compiled; the loop and the test
are in `main`, seeded for a reproducible outcome, the prints become a log and the checkpoint
saving is left out.
"""

import time

import numpy as np

import tracegrad as torch
import tracegrad.nn as nn

STEPS = 12
# Adam's first updates are about lr * sign(gradient), so float32 rounding (a different
# summation order) in near-zero gradients of this BatchNorm network moves the losses by
# up to ~2e-3 over 12 steps. In float64 they agree to 1e-14: test_resnet_in_float64.py.
COMPILED_RTOL = 1e-2
TORCH_RTOL = 1e-2

# Device configuration
device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')

# Hyper-parameters
num_epochs = 4
batch_size = 8
learning_rate = 0.001
decay_every = 2


# 3x3 convolution
def conv3x3(in_channels, out_channels, stride=1):
    return nn.Conv2d(in_channels, out_channels, kernel_size=3,
                     stride=stride, padding=1, bias=False)

# Residual block
class ResidualBlock(nn.Module):
    def __init__(self, in_channels, out_channels, stride=1, downsample=None):
        super(ResidualBlock, self).__init__()
        self.conv1 = conv3x3(in_channels, out_channels, stride)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = conv3x3(out_channels, out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.downsample = downsample

    def forward(self, x):
        residual = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        if self.downsample:
            residual = self.downsample(x)
        out += residual
        out = self.relu(out)
        return out

# ResNet
class ResNet(nn.Module):
    def __init__(self, block, layers, num_classes=10):
        super(ResNet, self).__init__()
        self.in_channels = 16
        self.conv = conv3x3(3, 16)
        self.bn = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = self.make_layer(block, 16, layers[0])
        self.layer2 = self.make_layer(block, 32, layers[1], 2)
        self.layer3 = self.make_layer(block, 64, layers[2], 2)
        self.avg_pool = nn.AvgPool2d(8)
        self.fc = nn.Linear(64, num_classes)

    def make_layer(self, block, out_channels, blocks, stride=1):
        downsample = None
        if (stride != 1) or (self.in_channels != out_channels):
            downsample = nn.Sequential(
                conv3x3(self.in_channels, out_channels, stride=stride),
                nn.BatchNorm2d(out_channels))
        layers = []
        layers.append(block(self.in_channels, out_channels, stride, downsample))
        self.in_channels = out_channels
        for i in range(1, blocks):
            layers.append(block(out_channels, out_channels))
        return nn.Sequential(*layers)

    def forward(self, x):
        out = self.conv(x)
        out = self.bn(out)
        out = self.relu(out)
        out = self.layer1(out)
        out = self.layer2(out)
        out = self.layer3(out)
        out = self.avg_pool(out)
        out = out.view(out.size(0), -1)
        out = self.fc(out)
        return out


# For updating learning rate
def update_lr(optimizer, lr):
    for param_group in optimizer.param_groups:
        param_group['lr'] = lr


def train_step(model, criterion, optimizer, images, labels):
    # Forward pass
    outputs = model(images)
    loss = criterion(outputs, labels)

    # Backward and optimize
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


_patterns = np.random.default_rng(0).random((10, 3, 32, 32))


def synthetic_cifar(rng, n):
    """n 3x32x32 images in [0, 1]: one of ten colour patterns with noise, and its class."""
    labels = rng.integers(0, 10, n)
    images = 0.5 * _patterns[labels] + 0.5 * rng.random((n, 3, 32, 32))
    return torch.tensor(images, dtype=torch.get_default_dtype()), torch.tensor(labels)


def main(steps=STEPS, compiled=False, init=None):
    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    per_epoch = -(-steps // num_epochs)
    train_dataset = torch.utils.data.TensorDataset(*synthetic_cifar(rng, per_epoch * batch_size))
    test_dataset = torch.utils.data.TensorDataset(*synthetic_cifar(rng, 40))

    # Data loader
    train_loader = torch.utils.data.DataLoader(dataset=train_dataset,
                                               batch_size=batch_size,
                                               shuffle=False)

    test_loader = torch.utils.data.DataLoader(dataset=test_dataset,
                                              batch_size=batch_size,
                                              shuffle=False)

    model = ResNet(ResidualBlock, [2, 2, 2]).to(device)
    if init is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

    # Loss and optimizer
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    step = torch.compile(train_step) if compiled else train_step
    log = {"losses": [], "step_seconds": [], "lrs": []}
    # Train the model
    curr_lr = learning_rate
    for epoch in range(num_epochs):
        for i, (images, labels) in enumerate(train_loader):
            images = images.to(device)
            labels = labels.to(device)
            start_time = time.perf_counter()
            loss = step(model, criterion, optimizer, images, labels)
            log["losses"].append(loss.item())
            log["step_seconds"].append(time.perf_counter() - start_time)
            log["lrs"].append(optimizer.param_groups[0]['lr'])

        # Decay learning rate
        if (epoch+1) % decay_every == 0:
            curr_lr /= 3
            update_lr(optimizer, curr_lr)

    # Test the model
    model.eval()
    with torch.no_grad():
        correct = 0
        total = 0
        for images, labels in test_loader:
            images = images.to(device)
            labels = labels.to(device)
            outputs = model(images)
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()

    return {**log, "init": start, "accuracy": correct / total}


def check(result):
    losses = result["losses"]
    assert len(losses) == STEPS and np.isfinite(losses).all(), losses
    assert np.mean(losses[-3:]) < 0.5 * losses[0], losses
    # (The test runs in eval mode on BatchNorm running statistics that 12 batches have moved
    # only part of the way from their initial 0 and 1, so its accuracy is no outcome here.)
    assert 0 <= result["accuracy"] <= 1, result["accuracy"]
    per_epoch = STEPS // num_epochs
    assert result["lrs"][-1] == learning_rate / 3 ** ((num_epochs - 1) // decay_every), result["lrs"]
    assert result["lrs"][2 * per_epoch] == learning_rate / 3, result["lrs"]
