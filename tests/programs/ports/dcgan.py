"""A deep convolutional GAN: a ConvTranspose2d/BatchNorm2d/ReLU generator and a
Conv2d/BatchNorm2d/LeakyReLU discriminator initialized by `apply(weights_init)`, BCELoss,
two Adam optimizers, the discriminator and generator updates of one iteration.

Source: pytorch/examples, dcgan/main.py (commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch` (and its `nn`, `optim`, `utils.data`); the argparse
options are an `opt` namespace in a reduced configuration (the models' fixed 64x64 images,
but ngf = ndf = 4, nz = 8, batch 8); the dataset is a `TensorDataset` of synthetic images
(blurred random blobs in [-1, 1], as the original's Normalize gives) from a NumPy generator,
loaded in order (shuffle would draw from torch's generator); the noise of each step
(`torch.randn(batch_size, nz, 1, 1)`) comes from NumPy and is passed in; the body of the
loop is `train_step` so it can be compiled; the prints become a log, and the image and
checkpoint saving is left out.
"""

import time
from types import SimpleNamespace

import numpy as np

import tracegrad as torch
import tracegrad.nn as nn
import tracegrad.optim as optim
import tracegrad.utils.data

STEPS = 20
COMPILED_RTOL = 1e-4
TORCH_RTOL = 1e-3

opt = SimpleNamespace(batchSize=8, imageSize=64, nz=8, ngf=4, ndf=4, lr=0.0002, beta1=0.5,
                      ngpu=1, workers=0, manualSeed=1)
nc = 3
ngpu = int(opt.ngpu)
nz = int(opt.nz)
ngf = int(opt.ngf)
ndf = int(opt.ndf)


# custom weights initialization called on netG and netD
def weights_init(m):
    classname = m.__class__.__name__
    if classname.find('Conv') != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find('BatchNorm') != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, ngpu):
        super(Generator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            # input is Z, going into a convolution
            nn.ConvTranspose2d(     nz, ngf * 8, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 8),
            nn.ReLU(True),
            # state size. (ngf*8) x 4 x 4
            nn.ConvTranspose2d(ngf * 8, ngf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 4),
            nn.ReLU(True),
            # state size. (ngf*4) x 8 x 8
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            # state size. (ngf*2) x 16 x 16
            nn.ConvTranspose2d(ngf * 2,     ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            # state size. (ngf) x 32 x 32
            nn.ConvTranspose2d(    ngf,      nc, 4, 2, 1, bias=False),
            nn.Tanh()
            # state size. (nc) x 64 x 64
        )

    def forward(self, input):

        if (input.is_cuda or input.is_xpu) and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


class Discriminator(nn.Module):
    def __init__(self, ngpu):
        super(Discriminator, self).__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            # input is (nc) x 64 x 64
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf) x 32 x 32
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*2) x 16 x 16
            nn.Conv2d(ndf * 2, ndf * 4, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 4),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*4) x 8 x 8
            nn.Conv2d(ndf * 4, ndf * 8, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 8),
            nn.LeakyReLU(0.2, inplace=True),
            # state size. (ndf*8) x 4 x 4
            nn.Conv2d(ndf * 8, 1, 4, 1, 0, bias=False),
            nn.Sigmoid()
        )

    def forward(self, input):
        if (input.is_cuda or input.is_xpu) and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)

        return output.view(-1, 1).squeeze(1)


real_label = 1
fake_label = 0


def train_step(netD, netG, criterion, optimizerD, optimizerG, device, data, noise):
    ############################
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    ###########################
    # train with real
    netD.zero_grad()
    real_cpu = data[0].to(device)
    batch_size = real_cpu.size(0)
    label = torch.full((batch_size,), real_label,
                       dtype=real_cpu.dtype, device=device)

    output = netD(real_cpu)
    errD_real = criterion(output, label)
    errD_real.backward()
    D_x = output.mean().item()

    # train with fake
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    D_G_z1 = output.mean().item()
    errD = errD_real + errD_fake
    optimizerD.step()

    ############################
    # (2) Update G network: maximize log(D(G(z)))
    ###########################
    netG.zero_grad()
    label.fill_(real_label)  # fake labels are real for generator cost
    output = netD(fake)
    errG = criterion(output, label)
    errG.backward()
    D_G_z2 = output.mean().item()
    optimizerG.step()
    return errD, errG, D_x, D_G_z1, D_G_z2


def synthetic_images(rng, n):
    """n 3x64x64 images of a few soft coloured blobs each, scaled to [-1, 1]."""
    ys, xs = np.mgrid[0:64, 0:64] / 63.0
    images = np.zeros((n, nc, 64, 64))
    for _ in range(3):
        cy, cx = rng.random((2, n, 1, 1))
        radius = 0.1 + 0.2 * rng.random((n, 1, 1))
        blob = np.exp(-((ys - cy) ** 2 + (xs - cx) ** 2) / (2 * radius ** 2))
        images += blob[:, None] * rng.random((n, nc, 1, 1))
    return torch.tensor((np.clip(images, 0, 1) * 2 - 1).astype(np.float32))


def main(steps=STEPS, compiled=False, init=None):
    torch.manual_seed(opt.manualSeed)
    device = torch.device("cpu")
    rng = np.random.default_rng(0)
    dataset = torch.utils.data.TensorDataset(synthetic_images(rng, steps * opt.batchSize))
    dataloader = torch.utils.data.DataLoader(dataset, batch_size=opt.batchSize,
                                             shuffle=False, num_workers=int(opt.workers))

    netG = Generator(ngpu).to(device)
    netG.apply(weights_init)
    netD = Discriminator(ngpu).to(device)
    netD.apply(weights_init)
    if init is not None:
        netG.load_state_dict({k[5:]: torch.tensor(v) for k, v in init.items() if k.startswith("netG.")})
        netD.load_state_dict({k[5:]: torch.tensor(v) for k, v in init.items() if k.startswith("netD.")})
    start = {f"{name}.{k}": v.detach().numpy().copy()
             for name, net in (("netG", netG), ("netD", netD)) for k, v in net.state_dict().items()}

    criterion = nn.BCELoss()

    # setup optimizer
    optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
    optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

    step = torch.compile(train_step) if compiled else train_step
    log = {"losses": [], "step_seconds": [], "errD": [], "errG": [], "D_x": [], "D_G_z1": [], "printed": []}
    for i, data in enumerate(dataloader, 0):
        noise = torch.tensor(rng.standard_normal((opt.batchSize, nz, 1, 1)).astype(np.float32))
        start_time = time.perf_counter()
        errD, errG, D_x, D_G_z1, D_G_z2 = step(netD, netG, criterion, optimizerD, optimizerG, device, data, noise)
        log["step_seconds"].append(time.perf_counter() - start_time)
        log["losses"].append(errD.item() + errG.item())
        log["errD"].append(errD.item())
        log["errG"].append(errG.item())
        log["D_x"].append(D_x)
        log["D_G_z1"].append(D_G_z1)
        log["printed"].append('[%d/%d][%d/%d] Loss_D: %.4f Loss_G: %.4f D(x): %.4f D(G(z)): %.4f / %.4f'
                              % (0, 1, i, len(dataloader),
                                 errD.item(), errG.item(), D_x, D_G_z1, D_G_z2))
    return {**log, "init": start}


def check(result):
    assert len(result["losses"]) == STEPS and np.isfinite(result["losses"]).all(), result["losses"]
    # The discriminator learns to tell the blobs from the generator's images: its loss falls
    # and it rates real images higher than at first, and above the fakes.
    first, last = slice(0, 4), slice(-4, None)
    errD, D_x, D_G_z1 = (np.asarray(result[k]) for k in ("errD", "D_x", "D_G_z1"))
    assert errD[last].mean() < errD[first].mean() * 0.9, errD
    assert D_x[last].mean() > D_x[first].mean() + 0.05, D_x
    assert D_x[last].mean() > D_G_z1[last].mean() + 0.1, (D_x, D_G_z1)
    assert result["printed"][0].startswith("[0/1][0/%d] Loss_D: " % STEPS), result["printed"]
