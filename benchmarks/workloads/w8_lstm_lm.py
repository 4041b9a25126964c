"""W8: a training step of pytorch/examples' word_language_model (model.py RNNModel with
LSTM, main.py's train loop body): truncated backpropagation through time.

Embedding 1000 x 200, a 2-layer `nn.LSTM` (200 hidden), a linear decoder to 1000 tokens and
`log_softmax`; `nn.NLLLoss`. One step takes the next bptt=35 window of a batchified token
stream (batch 20) with `get_batch`, detaches the hidden state carried from the previous
step (`repackage_hidden`), runs forward and backward, clips the gradient norm to 0.25 and
updates with the example's hand-written SGD (`p.data.add_(p.grad, alpha=-lr)`, lr 20).
The example's defaults except the vocabulary (Wikitext-2 has 33,278 tokens) and dropout 0.
"""

from __future__ import annotations

import numpy as np
from workloads import _models

CASES = {"W8-lstm": "W8 LSTM language model step (word_language_model, 2x200, bptt 35, batch 20)"}
PEERS = _models.LIBRARY_PEERS
CHECK_STEPS = _models.CHECK_STEPS
SIZES = {"ntoken": 1000, "emsize": 200, "nhid": 200, "nlayers": 2, "bptt": 35, "batch": 20}
SMOKE_SIZES = {"ntoken": 50, "emsize": 16, "nhid": 16, "nlayers": 2, "bptt": 5, "batch": 4}
WINDOWS = 6  # bptt windows in the token stream; the step cycles through them
LR, CLIP = 20.0, 0.25
postprocess = _models.postprocess
check_floors = _models.check_floors


def program(torch):
    """The model class and the helpers of main.py, for `torch` or `tracegrad as torch`."""
    nn = torch.nn
    F = torch.nn.functional

    class RNNModel(nn.Module):
        def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.0):
            super().__init__()
            self.ntoken = ntoken
            self.drop = nn.Dropout(dropout)
            self.encoder = nn.Embedding(ntoken, ninp)
            self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
            self.decoder = nn.Linear(nhid, ntoken)
            self.nhid = nhid
            self.nlayers = nlayers

        def forward(self, input, hidden):
            emb = self.drop(self.encoder(input))
            output, hidden = self.rnn(emb, hidden)
            output = self.drop(output)
            decoded = self.decoder(output)
            decoded = decoded.view(-1, self.ntoken)
            return F.log_softmax(decoded, dim=1), hidden

        def init_hidden(self, bsz):
            weight = next(self.parameters())
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))

    def repackage_hidden(h):
        """Wraps hidden states in new Tensors, to detach them from their history."""
        if isinstance(h, torch.Tensor):
            return h.detach()
        return tuple(repackage_hidden(v) for v in h)

    def get_batch(source, i, bptt):
        seq_len = min(bptt, len(source) - 1 - i)
        data = source[i:i + seq_len]
        target = source[i + 1:i + 1 + seq_len].view(-1)
        return data, target

    return RNNModel, repackage_hidden, get_batch


def _sizes(inputs: dict) -> dict:
    rows, batch = inputs["stream"].shape
    return dict(SMOKE_SIZES if batch == SMOKE_SIZES["batch"] else SIZES)


def make_inputs(case: str, smoke: bool) -> dict:
    s = SMOKE_SIZES if smoke else SIZES
    rng = np.random.default_rng(8)
    # batchify: the stream as (rows, batch) columns, one bptt window per step plus the target shift
    return {"stream": rng.integers(0, s["ntoken"], (WINDOWS * s["bptt"] + 1, s["batch"]), dtype=np.int64)}


def gemms(case: str, inputs: dict) -> list:
    """Per layer and time step the LSTM's two products (input and hidden, batch rows, 4*nhid
    gates) with their backward products (the first layer's input gradient goes to the
    embedding, which needs it); the decoder on bptt*batch rows."""
    s = _sizes(inputs)
    steps, batch, h = s["bptt"], s["batch"], s["nhid"]
    gemms = []
    for layer in range(s["nlayers"]):
        fan_in = s["emsize"] if layer == 0 else h
        gemms += _models.linear_gemms(batch, fan_in, 4 * h, count=steps)
        gemms += _models.linear_gemms(batch, h, 4 * h, count=steps)
    return gemms + _models.linear_gemms(steps * batch, h, s["ntoken"])


def parameter_count(inputs: dict) -> int:
    s = _sizes(inputs)
    h = s["nhid"]
    lstm = sum(4 * h * ((s["emsize"] if layer == 0 else h) + h + 2) for layer in range(s["nlayers"]))
    return s["ntoken"] * s["emsize"] + lstm + s["ntoken"] * (h + 1)


def min_bytes(case: str, inputs: dict) -> int:
    s = _sizes(inputs)
    # SGD reads and writes the parameters; the window, its targets and the carried state
    window = 2 * s["bptt"] * s["batch"] * 8 + 2 * 2 * s["nlayers"] * s["batch"] * s["nhid"] * 4
    return _models.state_bytes(parameter_count(inputs), 1, window)


def make_model(torch, inputs: dict):
    s = _sizes(inputs)
    return program(torch)[0](s["ntoken"], s["emsize"], s["nhid"], s["nlayers"])


def build(peer: str, case: str, inputs: dict, dtype: str = "float32"):
    torch = _models.library(peer)
    s = _sizes(inputs)
    _, repackage_hidden, get_batch = program(torch)
    model = make_model(torch, inputs)
    if dtype == "float64":
        model = model.double()
    _models.load_parameters(torch, model, seed=8)
    criterion = torch.nn.NLLLoss()
    train_data = torch.from_numpy(inputs["stream"])

    def train_step(data, targets, hidden):
        hidden = repackage_hidden(hidden)
        model.zero_grad()
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-LR)
        return loss, hidden

    fn = _models.compile_step(torch, train_step, peer)
    state = {"i": 0, "hidden": model.init_hidden(s["batch"])}
    starts = range(0, train_data.size(0) - 1, s["bptt"])

    def step():
        data, targets = get_batch(train_data, starts[state["i"] % len(starts)], s["bptt"])
        state["i"] += 1
        loss, state["hidden"] = fn(data, targets, state["hidden"])
        return {"loss": loss}
    step.compiled = fn if peer == "tracegrad-compiled" else None
    return step
