"""A variational autoencoder on MNIST-sized images: linear encoder to a mean and a log-variance,
the reparameterization with `torch.randn_like`, a sigmoid decoder, binary cross-entropy plus
the KL divergence summed over the batch, Adam.

Source: pytorch/examples, vae/main.py (commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch` (and its `nn`, `optim`, `nn.functional`, `utils.data`);
the MNIST datasets are `TensorDataset`s of synthetic 28x28 images in [0, 1] (ten fixed
random stroke images, blurred by noise) from a NumPy generator; the argparse settings are an
`args` namespace in a reduced configuration (batch 16, 2 epochs of 10 batches); the body of
train's loop is `train_step` so it can be compiled, train and test return their losses and
the prints become a log; the image saving is left out. The noise of the reparameterization
is drawn by each library's own generator, so the PyTorch run is held only to `check`.
"""

import time
from types import SimpleNamespace

import numpy as np

import tracegrad as torch
import tracegrad.utils.data
from tracegrad import nn, optim
from tracegrad.nn import functional as F

STEPS = 20
COMPILED_RTOL = 1e-4
TORCH_RTOL = None

args = SimpleNamespace(batch_size=16, epochs=2, seed=1, log_interval=2)


class VAE(nn.Module):
    def __init__(self):
        super(VAE, self).__init__()

        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, 20)
        self.fc22 = nn.Linear(400, 20)
        self.fc3 = nn.Linear(20, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5*logvar)
        eps = torch.randn_like(std)
        return mu + eps*std

    def decode(self, z):
        h3 = F.relu(self.fc3(z))
        return torch.sigmoid(self.fc4(h3))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        z = self.reparameterize(mu, logvar)
        return self.decode(z), mu, logvar


# Reconstruction + KL divergence losses summed over all elements and batch
def loss_function(recon_x, x, mu, logvar):
    BCE = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction='sum')

    # see Appendix B from VAE paper:
    # Kingma and Welling. Auto-Encoding Variational Bayes. ICLR, 2014
    # https://arxiv.org/abs/1312.6114
    # 0.5 * sum(1 + log(sigma^2) - mu^2 - sigma^2)
    KLD = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())

    return BCE + KLD


def train_step(model, optimizer, data):
    optimizer.zero_grad()
    recon_batch, mu, logvar = model(data)
    loss = loss_function(recon_batch, data, mu, logvar)
    loss.backward()
    optimizer.step()
    return loss


def train(epoch, model, optimizer, train_loader, device, step, log):
    model.train()
    train_loss = 0
    for batch_idx, (data, _) in enumerate(train_loader):
        data = data.to(device)
        start_time = time.perf_counter()
        loss = step(model, optimizer, data)
        train_loss += loss.item()
        log["step_seconds"].append(time.perf_counter() - start_time)
        log["losses"].append(loss.item() / len(data))
        if batch_idx % args.log_interval == 0:
            log["printed"].append('Train Epoch: {} [{}/{} ({:.0f}%)]\tLoss: {:.6f}'.format(
                epoch, batch_idx * len(data), len(train_loader.dataset),
                100. * batch_idx / len(train_loader),
                loss.item() / len(data)))

    log["printed"].append('====> Epoch: {} Average loss: {:.4f}'.format(
          epoch, train_loss / len(train_loader.dataset)))


def test(epoch, model, test_loader, device):
    model.eval()
    test_loss = 0
    with torch.no_grad():
        for i, (data, _) in enumerate(test_loader):
            data = data.to(device)
            recon_batch, mu, logvar = model(data)
            test_loss += loss_function(recon_batch, data, mu, logvar).item()

    test_loss /= len(test_loader.dataset)
    return test_loss


_templates = np.random.default_rng(0).random((10, 28, 28)) < 0.2


def synthetic_digits(rng, n):
    """n 1x28x28 images in [0, 1]: a template 'digit' with noise, and its label."""
    labels = rng.integers(0, 10, n)
    images = np.clip(_templates[labels] * 0.8 + rng.random((n, 28, 28)) * 0.2, 0, 1)
    return torch.tensor(images[:, None].astype(np.float32)), torch.tensor(labels)


def main(steps=STEPS, compiled=False, init=None):
    torch.manual_seed(args.seed)
    device = torch.device("cpu")
    rng = np.random.default_rng(1)
    per_epoch = -(-steps // args.epochs)
    train_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*synthetic_digits(rng, per_epoch * args.batch_size)),
        batch_size=args.batch_size, shuffle=False)
    test_loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(*synthetic_digits(rng, 64)),
        batch_size=args.batch_size, shuffle=False)

    model = VAE().to(device)
    if init is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    optimizer = optim.Adam(model.parameters(), lr=1e-3)

    # The noise of the first step is drawn from the seed, whatever the initialization drew.
    torch.manual_seed(args.seed)
    step = torch.compile(train_step) if compiled else train_step
    log = {"losses": [], "step_seconds": [], "printed": [], "tests": []}
    for epoch in range(1, args.epochs + 1):
        train(epoch, model, optimizer, train_loader, device, step, log)
        log["tests"].append(test(epoch, model, test_loader, device))
    with torch.no_grad():
        sample = torch.tensor(rng.standard_normal((64, 20)).astype(np.float32)).to(device)
        sample = model.decode(sample).cpu()
    return {**log, "init": start, "sample": sample.view(64, 1, 28, 28).numpy()}


def check(result):
    losses = result["losses"]
    assert len(losses) == STEPS and np.isfinite(losses).all(), losses
    # Per image: 784 binary cross-entropies start near log 2 each; training falls well below.
    assert np.mean(losses[-3:]) < 0.8 * losses[0], losses
    assert result["tests"][-1] < result["tests"][0], result["tests"]
    assert result["sample"].shape == (64, 1, 28, 28)
    assert ((result["sample"] >= 0) & (result["sample"] <= 1)).all()
    assert result["printed"][-1].startswith("====> Epoch: 2 Average loss: "), result["printed"]
