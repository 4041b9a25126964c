"""A word-level language model made of a Transformer encoder: token embeddings scaled by
sqrt(d), sinusoidal positional encodings, nn.Transformer's encoder under a causal mask
(log of a lower-triangular matrix of ones) and a linear decoder to log-probabilities,
trained on fixed-length chunks with gradient clipping and a hand-written SGD update, the
learning rate annealed when the validation loss stops falling.

Source: pytorch/examples, word_language_model/model.py (PositionalEncoding,
TransformerModel) and main.py with `--model Transformer` (commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch` (and its `nn`, `nn.functional`); data.Corpus (files of
Wikitext-2) is `SyntheticCorpus`, token ids of a random Markov chain with two successors
per token drawn from a NumPy generator; argparse's settings are an `args` namespace in a
reduced configuration (Transformer, 32 tokens, embeddings 16, 2 heads, feed-forward 32,
2 encoder layers, batch 10, bptt 10, 2 epochs, learning rate 2: the default 20 makes this
small Transformer diverge); dropout is off so runs compare
(PositionalEncoding's through args.dropout=0, and nn.Transformer's, which TransformerModel
leaves at its default 0.1, set to 0 by `dropout_off`); main.py's module-level script is
`main`, which sets the globals train() and evaluate() read; the body of train's loop is
`train_step` (forward, backward, clipping and update) so it can be compiled, and train
records its losses and step times instead of printing; the RNN and optimizer branches
(other programs' settings), the checkpoint saving and the ONNX export are left out.
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

args = SimpleNamespace(model='Transformer', emsize=16, nhid=32, nlayers=2, nhead=2, lr=2,
                       clip=0.25, epochs=2, batch_size=10, bptt=10, dropout=0.0, seed=1111,
                       log_interval=4, dry_run=False)


# Temporarily leave PositionalEncoding module here. Will be moved somewhere else.
class PositionalEncoding(nn.Module):
    r"""Inject some information about the relative or absolute position of the tokens in the sequence.
        The positional encodings have the same dimension as the embeddings, so that the two can be summed.
        Here, we use sine and cosine functions of different frequencies.
    .. math:
        \text{PosEncoder}(pos, 2i) = sin(pos/10000^(2i/d_model))
        \text{PosEncoder}(pos, 2i+1) = cos(pos/10000^(2i/d_model))
        \text{where pos is the word position and i is the embed idx)
    Args:
        d_model: the embed dim (required).
        dropout: the dropout value (default=0.1).
        max_len: the max. length of the incoming sequence (default=5000).
    Examples:
        >>> pos_encoder = PositionalEncoding(d_model)
    """

    def __init__(self, d_model, dropout=0.1, max_len=5000):
        super(PositionalEncoding, self).__init__()
        self.dropout = nn.Dropout(p=dropout)

        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        pe = pe.unsqueeze(0).transpose(0, 1)
        self.register_buffer('pe', pe)

    def forward(self, x):
        r"""Inputs of forward function
        Args:
            x: the sequence fed to the positional encoder model (required).
        Shape:
            x: [sequence length, batch size, embed dim]
            output: [sequence length, batch size, embed dim]
        Examples:
            >>> output = pos_encoder(x)
        """

        x = x + self.pe[:x.size(0), :]
        return self.dropout(x)

class TransformerModel(nn.Transformer):
    """Container module with an encoder, a recurrent or transformer module, and a decoder."""

    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.5):
        super(TransformerModel, self).__init__(d_model=ninp, nhead=nhead, dim_feedforward=nhid, num_encoder_layers=nlayers)
        self.model_type = 'Transformer'
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)

        self.input_emb = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)

        self.init_weights()

    def _generate_square_subsequent_mask(self, sz):
        return torch.log(torch.tril(torch.ones(sz,sz)))

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.input_emb.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src, has_mask=True):
        if has_mask:
            device = src.device
            if self.src_mask is None or self.src_mask.size(0) != len(src):
                mask = self._generate_square_subsequent_mask(len(src)).to(device)
                self.src_mask = mask
        else:
            self.src_mask = None

        src = self.input_emb(src) * math.sqrt(self.ninp)
        src = self.pos_encoder(src)
        output = self.encoder(src, mask=self.src_mask)
        output = self.decoder(output)
        return F.log_softmax(output, dim=-1)


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
    ntokens = len(corpus.dictionary)
    with torch.no_grad():
        for i in range(0, data_source.size(0) - 1, args.bptt):
            data, targets = get_batch(data_source, i)
            output = model(data)
            output = output.view(-1, ntokens)
            total_loss += len(data) * criterion(output, targets).item()
    return total_loss / (len(data_source) - 1)


def train_step(data, targets, lr):
    ntokens = len(corpus.dictionary)
    model.zero_grad()
    output = model(data)
    output = output.view(-1, ntokens)
    loss = criterion(output, targets)
    loss.backward()

    # `clip_grad_norm` helps prevent the exploding gradient problem in RNNs / LSTMs.
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-lr)
    return loss


def train():
    # Turn on training mode which enables dropout.
    model.train()
    total_loss = 0.
    start_time = time.time()
    for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
        data, targets = get_batch(train_data, i)
        step_start = time.perf_counter()
        loss = step(data, targets, lr)
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


def dropout_off(model):
    for module in model.modules():
        if isinstance(module, nn.Dropout):
            module.p = 0.0
        if isinstance(module, nn.MultiheadAttention):
            module.dropout = 0.0


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

    model = TransformerModel(ntokens, args.emsize, args.nhead, args.nhid, args.nlayers, args.dropout).to(device)
    dropout_off(model)
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
    return {**log, "init": start, "test_loss": test_loss}


def check(result):
    losses = result["losses"]
    assert len(losses) == STEPS, losses
    # It starts at chance (log 32) and gets below the tokens' unigram entropy (about 2.5):
    # it predicts from the previous tokens.
    assert abs(losses[0] - math.log(32)) < 0.05 * math.log(32), losses
    assert np.mean(losses[-5:]) < 0.7 * losses[0], losses
    assert result["val_losses"][-1] < result["val_losses"][0], result["val_losses"]
    assert result["test_loss"] < 2.2, result["test_loss"]
    assert result["printed"][0].startswith('| epoch   1 |     4/   10 batches | lr 2.00 |'), result["printed"]
