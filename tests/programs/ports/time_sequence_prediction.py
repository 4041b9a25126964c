"""Time sequence prediction: two stacked LSTMCells run in a Python loop over a sine wave's
samples learn to predict the next sample, trained with LBFGS and a closure, then asked to
continue the waves into the future (their own outputs fed back as inputs).

Source: pytorch/examples, time_sequence_prediction/train.py and generate_sine_wave.py
(commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch` (and its `nn`, `optim`); generate_sine_wave.py's data
(saved with torch.save, loaded by train.py) is made in memory by the same NumPy code, smaller
(N=10 waves of L=20 samples, 3 of them the test set; 10 future samples instead of 1000);
LBFGS evaluates its closure at most 5 times a step (max_iter=5, default 20);
the `__main__` script is `main`, run for `steps` LBFGS steps; its closure is built once
outside the loop (the original redefines the same function each step) so that it can be
compiled, and records the loss it printed; the matplotlib drawing is left out (the
predictions are returned instead).
Compiled: LBFGS itself is eager (it branches on loss values), so `compiled=True` compiles
the closure, which holds the model's whole forward, loss and backward; LBFGS then calls
the compiled program up to 5 times a step.
"""

import time

import numpy as np

import tracegrad as torch
import tracegrad.nn as nn
import tracegrad.optim as optim

STEPS = 4
COMPILED_RTOL = 1e-7
TORCH_RTOL = 1e-6


class Sequence(nn.Module):
    def __init__(self):
        super(Sequence, self).__init__()
        self.lstm1 = nn.LSTMCell(1, 51)
        self.lstm2 = nn.LSTMCell(51, 51)
        self.linear = nn.Linear(51, 1)

    def forward(self, input, future = 0):
        outputs = []
        h_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t = torch.zeros(input.size(0), 51, dtype=torch.double)
        h_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)
        c_t2 = torch.zeros(input.size(0), 51, dtype=torch.double)

        for input_t in input.split(1, dim=1):
            h_t, c_t = self.lstm1(input_t, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        for i in range(future):# if we should predict the future
            h_t, c_t = self.lstm1(output, (h_t, c_t))
            h_t2, c_t2 = self.lstm2(h_t, (h_t2, c_t2))
            output = self.linear(h_t2)
            outputs += [output]
        outputs = torch.cat(outputs, dim=1)
        return outputs


def generate_sine_wave():
    np.random.seed(2)

    T = 20
    L = 20
    N = 10

    x = np.empty((N, L), 'int64')
    x[:] = np.array(range(L)) + np.random.randint(-4 * T, 4 * T, N).reshape(N, 1)
    data = np.sin(x / 1.0 / T).astype('float64')
    return data


def main(steps=STEPS, compiled=False, init=None):
    # set random seed to 0
    np.random.seed(0)
    torch.manual_seed(0)
    # load data and make training set
    data = generate_sine_wave()
    input = torch.from_numpy(data[3:, :-1])
    target = torch.from_numpy(data[3:, 1:])
    test_input = torch.from_numpy(data[:3, :-1])
    test_target = torch.from_numpy(data[:3, 1:])
    # build the model
    seq = Sequence()
    seq.double()
    if init is not None:
        seq.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in seq.state_dict().items()}
    criterion = nn.MSELoss()
    # use LBFGS as optimizer since we can load the whole data to train
    optimizer = optim.LBFGS(seq.parameters(), lr=0.8, max_iter=5)
    printed = []

    def closure():
        optimizer.zero_grad()
        out = seq(input)
        loss = criterion(out, target)
        loss.backward()
        return loss

    step_closure = torch.compile(closure) if compiled else closure

    def logged_closure():
        loss = step_closure()
        printed.append('loss: {}'.format(loss.item()))
        return loss

    losses, test_losses, seconds = [], [], []
    #begin to train
    for i in range(steps):
        printed.append('STEP: {}'.format(i))
        start_time = time.perf_counter()
        losses.append(optimizer.step(logged_closure).item())
        seconds.append(time.perf_counter() - start_time)
        # begin to predict, no need to track gradient here
        with torch.no_grad():
            future = 10
            pred = seq(test_input, future=future)
            loss = criterion(pred[:, :-future], test_target)
            test_losses.append(loss.item())
            y = pred.detach().numpy()
    return {"losses": losses, "init": start, "step_seconds": seconds, "printed": printed,
            "test_losses": test_losses, "prediction": y, "test_target": test_target.numpy()}


def check(result):
    losses, test_losses = result["losses"], result["test_losses"]
    assert len(losses) == STEPS, losses
    assert losses[-1] < losses[0] / 10, losses
    assert test_losses[-1] < test_losses[0] / 10, test_losses
    assert result["prediction"].shape == (3, 19 + 10)
    assert result["printed"][:2] == ['STEP: 0', 'loss: {}'.format(losses[0])], result["printed"][:3]
