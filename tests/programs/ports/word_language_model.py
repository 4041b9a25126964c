"""A word-level language model: an embedding, a two-layer LSTM and a decoder whose weight is
tied to the embedding's, trained with truncated backpropagation through time (the hidden
state carried across batches, detached by repackage_hidden), gradient clipping and a
hand-written SGD update, the learning rate annealed when the validation loss stops falling.

Source: pytorch/examples, word_language_model/model.py (RNNModel) and main.py
(commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch` (and its `nn`, `nn.functional`); data.Corpus (files of
Wikitext-2) is `SyntheticCorpus`, token ids of a random Markov chain with two successors
per token drawn from a NumPy generator; argparse's settings are an `args` namespace in a
reduced configuration (LSTM, tied, 32 tokens, sizes 16, 2 layers, batch 10, bptt 10, 2
epochs, dropout 0 so runs compare); main.py's module-level script is `main`, which sets the globals
train() and evaluate() read; the body of train's loop is `train_step` (the detach, forward,
backward, clipping and update) so it can be compiled, and train records its losses and step
times instead of printing; the Transformer and optimizer branches (other programs' settings),
the checkpoint saving and the ONNX export are left out.
"""

import math
import time
from types import SimpleNamespace

import numpy as np

import tracegrad as torch
import tracegrad.nn as nn
import tracegrad.nn.functional as F

STEPS = 20
COMPILED_RTOL = 1e-4
TORCH_RTOL = 1e-3

args = SimpleNamespace(model='LSTM', emsize=16, nhid=16, nlayers=2, lr=20, clip=0.25,
                       epochs=2, batch_size=10, bptt=10, dropout=0.0, tied=True, seed=1111,
                       log_interval=4, dry_run=False)


class RNNModel(nn.Module):
    """Container module with an encoder, a recurrent module, and a decoder."""

    def __init__(self, rnn_type, ntoken, ninp, nhid, nlayers, dropout=0.5, tie_weights=False):
        super(RNNModel, self).__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        if rnn_type in ['LSTM', 'GRU']:
            self.rnn = getattr(nn, rnn_type)(ninp, nhid, nlayers, dropout=dropout)
        else:
            try:
                nonlinearity = {'RNN_TANH': 'tanh', 'RNN_RELU': 'relu'}[rnn_type]
            except KeyError as e:
                raise ValueError( """An invalid option for `--model` was supplied,
                                 options are ['LSTM', 'GRU', 'RNN_TANH' or 'RNN_RELU']""") from e
            self.rnn = nn.RNN(ninp, nhid, nlayers, nonlinearity=nonlinearity, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)

        # Optionally tie weights as in:
        # "Using the Output Embedding to Improve Language Models" (Press & Wolf 2016)
        # https://arxiv.org/abs/1608.05859
        # and
        # "Tying Word Vectors and Word Classifiers: A Loss Framework for Language Modeling" (Inan et al. 2016)
        # https://arxiv.org/abs/1611.01462
        if tie_weights:
            if nhid != ninp:
                raise ValueError('When using the tied flag, nhid must be equal to emsize')
            self.decoder.weight = self.encoder.weight

        self.init_weights()

        self.rnn_type = rnn_type
        self.nhid = nhid
        self.nlayers = nlayers

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output)
        decoded = decoded.view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        if self.rnn_type == 'LSTM':
            return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                    weight.new_zeros(self.nlayers, bsz, self.nhid))
        else:
            return weight.new_zeros(self.nlayers, bsz, self.nhid)


class SyntheticCorpus:
    """data.Corpus's interface (a dictionary, and train/valid/test as 1-d tensors of token
    ids) over a random Markov chain in which each token is followed by one of two tokens."""

    def __init__(self, ntokens, lengths, seed=0):
        rng = np.random.default_rng(seed)
        self.dictionary = ['w{}'.format(i) for i in range(ntokens)]
        successors = rng.integers(0, ntokens, (ntokens, 2))
        splits = []
        for length in lengths:
            ids = np.empty(length, dtype=np.int64)
            ids[0] = rng.integers(ntokens)
            choices = rng.integers(0, 2, length)
            for k in range(1, length):
                ids[k] = successors[ids[k - 1], choices[k]]
            splits.append(torch.tensor(ids))
        self.train, self.valid, self.test = splits


device = torch.device("cpu")

# Starting from sequential data, batchify arranges the dataset into columns.
# For instance, with the alphabet as the sequence and batch size 4, we'd get
# ┌ a g m s ┐
# │ b h n t │
# │ c i o u │
# │ d j p v │
# │ e k q w │
# └ f l r x ┘.
# These columns are treated as independent by the model, which means that the
# dependence of e. g. 'g' on 'f' can not be learned, but allows more efficient
# batch processing.

def batchify(data, bsz):
    # Work out how cleanly we can divide the dataset into bsz parts.
    nbatch = data.size(0) // bsz
    # Trim off any extra elements that wouldn't cleanly fit (remainders).
    data = data.narrow(0, 0, nbatch * bsz)
    # Evenly divide the data across the bsz batches.
    data = data.view(bsz, -1).t().contiguous()
    return data.to(device)


def repackage_hidden(h):
    """Wraps hidden states in new Tensors, to detach them from their history."""

    if isinstance(h, torch.Tensor):
        return h.detach()
    else:
        return tuple(repackage_hidden(v) for v in h)


# get_batch subdivides the source data into chunks of length args.bptt.
# If source is equal to the example output of the batchify function, with
# a bptt-limit of 2, we'd get the following two Variables for i = 0:
# ┌ a g m s ┐ ┌ b h n t ┐
# └ b h n t ┘ └ c i o u ┘
# Note that despite the name of the function, the subdivison of data is not
# done along the batch dimension (i.e. dimension 1), since that was handled
# by the batchify function. The chunks are along dimension 0, corresponding
# to the seq_len dimension in the LSTM.

def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    data = source[i:i+seq_len]
    target = source[i+1:i+1+seq_len].view(-1)
    return data, target


def evaluate(data_source):
    # Turn on evaluation mode which disables dropout.
    model.eval()
    total_loss = 0.
    hidden = model.init_hidden(eval_batch_size)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train_step(data, targets, hidden, lr):
    # Starting each batch, we detach the hidden state from how it was previously produced.
    # If we didn't, the model would try backpropagating all the way to start of the dataset.
    model.zero_grad()
    hidden = repackage_hidden(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()

    # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss, hidden


def train():
    # Turn on training mode which enables dropout.
    model.train()
    total_loss = 0.
    start_time = time.time()
    hidden = model.init_hidden(args.batch_size)
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        step_start = time.perf_counter()
        loss, hidden = step(data, targets, hidden, lr)
        log["losses"].append(loss.item())
        log["step_seconds"].append(time.perf_counter() - step_start)

        total_loss += loss.item()

        if batch % args.log_interval == 0 and batch > 0:
            cur_loss = total_loss / args.log_interval
            elapsed = time.time() - start_time
            log["printed"].append('| epoch {:3d} | {:5d}/{:5d} batches | lr {:02.2f} | ms/batch {:5.2f} | '
                    'loss {:5.2f} | ppl {:8.2f}'.format(
                epoch, batch, len(train_data) // args.bptt, lr,
                elapsed * 1000 / args.log_interval, cur_loss, math.exp(cur_loss)))
            total_loss = 0
            start_time = time.time()
        if args.dry_run:
            break


def main(steps=STEPS, compiled=False, init=None):
    global corpus, eval_batch_size, train_data, val_data, test_data, model, criterion
    global step, log, lr, epoch

    # Set the random seed manually for reproducibility.
    torch.manual_seed(args.seed)

    batches_per_epoch = -(-steps // args.epochs)
    ntokens = 32
    eval_batch_size = 2
    corpus = SyntheticCorpus(ntokens, [args.batch_size * (batches_per_epoch * args.bptt + 1),
                                       eval_batch_size * (4 * args.bptt + 1),
                                       eval_batch_size * (4 * args.bptt + 1)])
    train_data = batchify(corpus.train, args.batch_size)
    val_data = batchify(corpus.valid, eval_batch_size)
    test_data = batchify(corpus.test, eval_batch_size)

    model = RNNModel(args.model, ntokens, args.emsize, args.nhid, args.nlayers, args.dropout, args.tied).to(device)
    if init is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

    criterion = nn.NLLLoss()

    step = torch.compile(train_step) if compiled else train_step
    log = {"losses": [], "step_seconds": [], "printed": [], "val_losses": [], "lrs": []}
    # Loop over epochs.
    lr = args.lr
    best_val_loss = None
    for epoch in range(1, args.epochs+1):
        train()
        val_loss = evaluate(val_data)
        log["val_losses"].append(val_loss)
        # Save the model if the validation loss is the best we've seen so far.
        if not best_val_loss or val_loss < best_val_loss:
            best_val_loss = val_loss
        else:
            # Anneal the learning rate if no improvement has been seen in the validation dataset.
            lr /= 4.0
        log["lrs"].append(lr)

    # Run on test data.
    test_loss = evaluate(test_data)
    return {**log, "init": start, "test_loss": test_loss,
            "tied": model.decoder.weight is model.encoder.weight}


def check(result):
    losses = result["losses"]
    assert len(losses) == STEPS, losses
    # It starts at chance (log 32) and, in this short run, learns about the tokens'
    # frequencies (the chain's unigram entropy is about 2.5).
    assert abs(losses[0] - math.log(32)) < 0.05 * math.log(32), losses
    assert np.mean(losses[-5:]) < 0.93 * losses[0], losses
    assert result["test_loss"] < 0.8 * math.log(32), result["test_loss"]
    assert result["tied"]
    assert result["printed"][0].startswith('| epoch   1 |     4/   10 batches | lr 20.00 |'), result["printed"]
