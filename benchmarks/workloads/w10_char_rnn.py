"""W10: the char-RNN name classification tutorial's training (pytorch/tutorials
intermediate_source/char_rnn_classification_tutorial.py, the RNN with i2h/i2o on the
concatenated input and hidden, and its `train` function): per-example, overhead-bound.

One example is a name: a (length, 1, 57) one-hot tensor run through the RNN one letter at a
time in a Python loop (`torch.cat`, two 185-input linears, `LogSoftmax`), `nn.NLLLoss` on
the last output, backward, the tutorial's hand-written SGD (`p.data.add_(p.grad.data,
alpha=-learning_rate)`, 0.005) and `loss.item()`. One step is 6 examples of lengths 3, 5,
6, 7, 9 and 12 (a name's length is the length of the loop, so a compiled `train` holds one
program per length; 6 stays under torch.compile's recompile limit of 8).
"""

from __future__ import annotations

import numpy as np
from workloads import _models

CASES = {"W10-charrnn": "W10 char-RNN classification, 6 names of 3-12 letters per step (overhead-bound)"}
PEERS = _models.LIBRARY_PEERS
CHECK_STEPS = _models.CHECK_STEPS
N_LETTERS, N_HIDDEN, N_CATEGORIES = 57, 128, 18
LENGTHS, SMOKE_LENGTHS = (3, 5, 6, 7, 9, 12), (2, 3)
LEARNING_RATE = 0.005
postprocess = _models.postprocess
check_floors = _models.check_floors


def program(torch):
    """The tutorial's RNN, for `torch` or `tracegrad as torch`."""
    nn = torch.nn

    class RNN(nn.Module):
        def __init__(self, input_size, hidden_size, output_size):
            super().__init__()
            self.hidden_size = hidden_size
            self.i2h = nn.Linear(input_size + hidden_size, hidden_size)
            self.i2o = nn.Linear(input_size + hidden_size, output_size)
            self.softmax = nn.LogSoftmax(dim=1)

        def forward(self, input, hidden):
            combined = torch.cat((input, hidden), 1)
            hidden = self.i2h(combined)
            output = self.i2o(combined)
            output = self.softmax(output)
            return output, hidden

        def initHidden(self):
            return torch.zeros(1, self.hidden_size)

    return RNN


def make_inputs(case: str, smoke: bool) -> dict:
    lengths = SMOKE_LENGTHS if smoke else LENGTHS
    rng = np.random.default_rng(10)
    inputs = {"categories": rng.integers(0, N_CATEGORIES, (len(lengths), 1), dtype=np.int64)}
    for i, length in enumerate(lengths):
        line = np.zeros((length, 1, N_LETTERS), np.float32)  # lineToTensor: one-hot letters
        line[np.arange(length), 0, rng.integers(0, N_LETTERS, length)] = 1.0
        inputs[f"line{i}"] = line
    return inputs


def _lines(inputs: dict) -> list[np.ndarray]:
    return [inputs[f"line{i}"] for i in range(len(inputs["categories"]))]


def gemms(case: str, inputs: dict) -> list:
    """Per letter: i2h and i2o on one row of 57+128 inputs, with their weight gradients and
    the gradient of the concatenated input (which carries the hidden state's gradient)."""
    combined = N_LETTERS + N_HIDDEN
    gemms = []
    for line in _lines(inputs):
        gemms += _models.linear_gemms(1, combined, N_HIDDEN, count=len(line))
        gemms += _models.linear_gemms(1, combined, N_CATEGORIES, count=len(line))
    return gemms


def parameter_count(inputs: dict) -> int:
    return (N_LETTERS + N_HIDDEN + 1) * (N_HIDDEN + N_CATEGORIES)


def min_bytes(case: str, inputs: dict) -> int:
    # SGD reads and writes the parameters once per example
    examples = len(inputs["categories"])
    return examples * _models.state_bytes(parameter_count(inputs), 1, 0) + sum(x.nbytes for x in _lines(inputs))


def make_model(torch, inputs: dict):
    return program(torch)(N_LETTERS, N_HIDDEN, N_CATEGORIES)


def build(peer: str, case: str, inputs: dict, dtype: str = "float32"):
    torch = _models.library(peer)
    rnn = make_model(torch, inputs)
    if dtype == "float64":
        rnn = rnn.double()
        torch.set_default_dtype(torch.float64)  # initHidden's zeros, as the model's dtype
    _models.load_parameters(torch, rnn, seed=10)
    criterion = torch.nn.NLLLoss()
    examples = [(torch.from_numpy(inputs["categories"][i]), _models.float_inputs(torch, line, dtype))
                for i, line in enumerate(_lines(inputs))]

    def train(category_tensor, line_tensor):
        hidden = rnn.initHidden()
        rnn.zero_grad()
        for i in range(line_tensor.size()[0]):
            output, hidden = rnn(line_tensor[i], hidden)
        loss = criterion(output, category_tensor)
        loss.backward()
        for p in rnn.parameters():
            p.data.add_(p.grad.data, alpha=-LEARNING_RATE)
        return output, loss.item()

    fn = _models.compile_step(torch, train, peer)

    def step():
        return {"loss": np.array([fn(category, line)[1] for category, line in examples])}
    step.compiled = fn if peer == "tracegrad-compiled" else None
    return step
