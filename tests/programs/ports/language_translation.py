"""A sequence-to-sequence Transformer translator: token embeddings plus sinusoidal positional
encodings into nn.Transformer (encoder and decoder, causal target mask, padding masks), a
linear head, cross entropy ignoring padding, Adam; padded batches from a DataLoader with a
collate function; greedy decoding.

Source: pytorch/examples, language_translation/src/model.py (PositionalEncoding, Translator),
src/data.py (the collate function, generate_square_subsequent_mask, create_mask) and main.py
(greedy_decode, train, validate, main) (commit 77f55b9, 2025-08-25).
Ported: `import tracegrad as torch` (and its `nn`, `nn.functional`, `nn.utils.rnn`,
`utils.data`); Multi30k with spaCy tokenizers and torchtext vocabularies is a toy
translation made from a NumPy generator: the target is the source's word ids reversed
(`get_data` keeps the special symbols, the BOS/EOS tensor transform and the padding collate
function); the argparse options are an `opts` namespace in a reduced configuration
(embeddings 32, 4 heads, 2+2 layers, feed-forward 64, batch 16, learning rate 1e-3,
dropout 0 so runs compare); the body of train's loop is `train_step` so it can be
compiled, and train records its losses and step times; tqdm, logging and checkpoint saving
are left out, and inference's interactive loop is one greedy translation of a validation
sentence.
"""

import math
import time
from types import SimpleNamespace

import numpy as np

import tracegrad as torch
from tracegrad import nn
from tracegrad.nn.utils.rnn import pad_sequence
from tracegrad.utils.data import DataLoader

STEPS = 12
COMPILED_RTOL = 1e-4
TORCH_RTOL = 1e-3

# Train on the GPU if possible
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PositionalEncoding(nn.Module):
    def __init__(
        self,
        emb_size,
        dropout,
        maxlen=5000
    ):
        super(PositionalEncoding, self).__init__()
        den = torch.exp(- torch.arange(0, emb_size, 2)* math.log(10000) / emb_size)
        pos = torch.arange(0, maxlen).reshape(maxlen, 1)
        pos_embedding = torch.zeros((maxlen, emb_size))
        pos_embedding[:, 0::2] = torch.sin(pos * den)
        pos_embedding[:, 1::2] = torch.cos(pos * den)
        pos_embedding = pos_embedding.unsqueeze(-2)

        self.dropout = nn.Dropout(dropout)
        self.register_buffer('pos_embedding', pos_embedding)

    def forward(self, token_embedding):
        return self.dropout(token_embedding + self.pos_embedding[:token_embedding.size(0), :])

class Translator(nn.Module):
    def __init__(
            self,
            num_encoder_layers,
            num_decoder_layers,
            embed_size,
            num_heads,
            src_vocab_size,
            tgt_vocab_size,
            dim_feedforward,
            dropout
        ):
        super(Translator, self).__init__()

        # Output of embedding must be equal (embed_size)
        self.src_embedding = nn.Embedding(src_vocab_size, embed_size)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, embed_size)

        self.pos_enc = PositionalEncoding(embed_size, dropout)

        self.transformer = nn.Transformer(
            d_model=embed_size,
            nhead=num_heads,
            num_encoder_layers=num_encoder_layers,
            num_decoder_layers=num_decoder_layers,
            dim_feedforward=dim_feedforward,
            dropout=dropout
        )

        self.ff = nn.Linear(embed_size, tgt_vocab_size)

        self._init_weights()

    def _init_weights(self):
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.xavier_uniform_(p)

    def forward(self, src, trg, src_mask, tgt_mask, src_padding_mask, tgt_padding_mask, memory_key_padding_mask):

        src_emb = self.pos_enc(self.src_embedding(src))
        tgt_emb = self.pos_enc(self.tgt_embedding(trg))

        outs = self.transformer(
            src_emb,
            tgt_emb,
            src_mask,
            tgt_mask,
            None,
            src_padding_mask,
            tgt_padding_mask,
            memory_key_padding_mask
        )

        return self.ff(outs)

    def encode(self, src, src_mask):

        embed = self.src_embedding(src)

        pos_enc = self.pos_enc(embed)

        return self.transformer.encoder(pos_enc, src_mask)

    def decode(self, tgt, memory, tgt_mask):
        
        embed = self.tgt_embedding(tgt)

        pos_enc = self.pos_enc(embed)

        return self.transformer.decoder(pos_enc, memory, tgt_mask)


# --- src/data.py ---

def reversal_pairs(rng, n, vocab_size, special_count, max_words):
    """n (source, target) sentences as lists of word ids: the target is the source reversed."""
    pairs = []
    for _ in range(n):
        words = rng.integers(special_count, vocab_size, rng.integers(2, max_words + 1)).tolist()
        pairs.append((words, words[::-1]))
    return pairs


def get_data(opts):

    # Define a token "unkown", "padding", "beginning of sentence", and "end of sentence"
    special_symbols = {
        "<unk>":0,
        "<pad>":1,
        "<bos>":2,
        "<eos>":3
    }

    rng = np.random.default_rng(opts.seed)
    train_iterator = reversal_pairs(rng, opts.train_sentences, opts.vocab_size, len(special_symbols), opts.max_words)
    valid_iterator = reversal_pairs(rng, opts.batch, opts.vocab_size, len(special_symbols), opts.max_words)

    src_vocab = tgt_vocab = range(opts.vocab_size)

    # Function to add BOS/EOS and create tensor for input sequence indices
    def _tensor_transform(token_ids):
        return torch.cat(
            (torch.tensor([special_symbols["<bos>"]]),
             torch.tensor(token_ids),
             torch.tensor([special_symbols["<eos>"]]))
        )

    src_lang_transform = tgt_lang_transform = _tensor_transform

    # Now we want to convert the torchtext data pipeline to a dataloader. We
    # will need to collate batches
    def _collate_fn(batch):
        src_batch, tgt_batch = [], []
        for src_sample, tgt_sample in batch:
            src_batch.append(src_lang_transform(src_sample))
            tgt_batch.append(tgt_lang_transform(tgt_sample))

        src_batch = pad_sequence(src_batch, padding_value=special_symbols["<pad>"])
        tgt_batch = pad_sequence(tgt_batch, padding_value=special_symbols["<pad>"])
        return src_batch, tgt_batch

    # Create the dataloader
    train_dataloader = DataLoader(train_iterator, batch_size=opts.batch, collate_fn=_collate_fn)
    valid_dataloader = DataLoader(valid_iterator, batch_size=opts.batch, collate_fn=_collate_fn)

    return train_dataloader, valid_dataloader, src_vocab, tgt_vocab, src_lang_transform, tgt_lang_transform, special_symbols

def generate_square_subsequent_mask(size, device):
    mask = (torch.triu(torch.ones((size, size), device=device)) == 1).transpose(0, 1)
    mask = mask.float().masked_fill(mask == 0, float('-inf')).masked_fill(mask == 1, float(0.0))
    return mask

# Create masks for input into model
def create_mask(src, tgt, pad_idx, device):

    # Get sequence length
    src_seq_len = src.shape[0]
    tgt_seq_len = tgt.shape[0]

    # Generate the mask
    tgt_mask = generate_square_subsequent_mask(tgt_seq_len, device)
    src_mask = torch.zeros((src_seq_len, src_seq_len),device=device).type(torch.bool)

    # Overlay the mask over the original input
    src_padding_mask = (src == pad_idx).transpose(0, 1)
    tgt_padding_mask = (tgt == pad_idx).transpose(0, 1)
    return src_mask, tgt_mask, src_padding_mask, tgt_padding_mask


# --- main.py ---

# Function to generate output sequence using greedy algorithm
def greedy_decode(model, src, src_mask, max_len, start_symbol, end_symbol):

    # Move to device
    src = src.to(DEVICE)
    src_mask = src_mask.to(DEVICE)

    # Encode input
    memory = model.encode(src, src_mask)

    # Output will be stored here
    ys = torch.ones(1, 1).fill_(start_symbol).type(torch.long).to(DEVICE)

    # For each element in our translation (which could range up to the maximum translation length)
    for _ in range(max_len-1):

        # Decode the encoded representation of the input
        memory = memory.to(DEVICE)
        tgt_mask = (generate_square_subsequent_mask(ys.size(0), DEVICE).type(torch.bool)).to(DEVICE)
        out = model.decode(ys, memory, tgt_mask)

        # Reshape
        out = out.transpose(0, 1)

        # Covert to probabilities and take the max of these probabilities
        prob = model.ff(out[:, -1])
        _, next_word = torch.max(prob, dim=1)
        next_word = next_word.item()

        # Now we have an output which is the vector representation of the translation
        ys = torch.cat([ys, torch.ones(1, 1).type_as(src.data).fill_(next_word)], dim=0)
        if next_word == end_symbol:
            break

    return ys


def train_step(model, src, tgt, loss_fn, optim, special_symbols):

    # We need to reshape the input slightly to fit into the transformer
    tgt_input = tgt[:-1, :]

    # Create masks
    src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt_input, special_symbols["<pad>"], DEVICE)

    # Pass into model, get probability over the vocab out
    logits = model(src, tgt_input, src_mask, tgt_mask,src_padding_mask, tgt_padding_mask, src_padding_mask)

    # Reset gradients before we try to compute the gradients over the loss
    optim.zero_grad()

    # Get original shape back
    tgt_out = tgt[1:, :]

    # Compute loss and gradient over that loss
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
    loss.backward()

    # Step weights
    optim.step()
    return loss


# Train the model for 1 epoch
def train(model, train_dl, loss_fn, optim, special_symbols, opts, step, log):

    # Object for accumulating losses
    losses = 0

    # Put model into training mode
    model.train()
    for src, tgt in train_dl:

        src = src.to(DEVICE)
        tgt = tgt.to(DEVICE)

        start_time = time.perf_counter()
        loss = step(model, src, tgt, loss_fn, optim, special_symbols)
        log["losses"].append(loss.item())
        log["step_seconds"].append(time.perf_counter() - start_time)

        # Accumulate a running loss for reporting
        losses += loss.item()

        if opts.dry_run:
            break

    # Return the average loss
    return losses / len(list(train_dl))

# Check the model accuracy on the validation dataset
def validate(model, valid_dl, loss_fn, special_symbols):
    
    # Object for accumulating losses
    losses = 0

    # Turn off gradients a moment
    model.eval()

    for src, tgt in valid_dl:

        src = src.to(DEVICE)
        tgt = tgt.to(DEVICE)

        # We need to reshape the input slightly to fit into the transformer
        tgt_input = tgt[:-1, :]

        # Create masks
        src_mask, tgt_mask, src_padding_mask, tgt_padding_mask = create_mask(src, tgt_input, special_symbols["<pad>"], DEVICE)

        # Pass into model, get probability over the vocab out
        logits = model(src, tgt_input, src_mask, tgt_mask,src_padding_mask, tgt_padding_mask, src_padding_mask)

        # Get original shape back, compute loss, accumulate that loss
        tgt_out = tgt[1:, :]
        loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
        losses += loss.item()

    # Return the average loss
    return losses / len(list(valid_dl))


def main(steps=STEPS, compiled=False, init=None):
    opts = SimpleNamespace(epochs=2, lr=1e-3, batch=16, attn_heads=4, enc_layers=2, dec_layers=2,
                           embed_size=32, dim_feedforward=64, dropout=0.0, dry_run=False,
                           vocab_size=14, max_words=6, seed=0)
    opts.train_sentences = -(-steps // opts.epochs) * opts.batch

    # Get training data, tokenizer and vocab
    # objects as well as any special symbols we added to our dataset
    train_dl, valid_dl, src_vocab, tgt_vocab, src_transform, _, special_symbols = get_data(opts)

    src_vocab_size = len(src_vocab)
    tgt_vocab_size = len(tgt_vocab)

    # Create model
    model = Translator(
        num_encoder_layers=opts.enc_layers,
        num_decoder_layers=opts.dec_layers,
        embed_size=opts.embed_size,
        num_heads=opts.attn_heads,
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        dim_feedforward=opts.dim_feedforward,
        dropout=opts.dropout
    ).to(DEVICE)
    if init is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

    # Set up our learning tools
    loss_fn = torch.nn.CrossEntropyLoss(ignore_index=special_symbols["<pad>"])

    # These special values are from the "Attention is all you need" paper
    optim = torch.optim.Adam(model.parameters(), lr=opts.lr, betas=(0.9, 0.98), eps=1e-9)

    step = torch.compile(train_step) if compiled else train_step
    log = {"losses": [], "step_seconds": [], "train_losses": [], "val_losses": []}
    for idx, epoch in enumerate(range(1, opts.epochs+1)):
        log["train_losses"].append(train(model, train_dl, loss_fn, optim, special_symbols, opts, step, log))
        log["val_losses"].append(validate(model, valid_dl, loss_fn, special_symbols))

    # One greedy translation, as inference does for a typed sentence
    model.eval()
    sentence = valid_dl.dataset[0][0]
    src = src_transform(sentence).view(-1, 1)
    num_tokens = src.shape[0]
    src_mask = (torch.zeros(num_tokens, num_tokens)).type(torch.bool)
    tgt_tokens = greedy_decode(
        model, src, src_mask, max_len=num_tokens+5, start_symbol=special_symbols["<bos>"], end_symbol=special_symbols["<eos>"]
    ).flatten()
    return {**log, "init": start, "translation": list(tgt_tokens.cpu().numpy()), "sentence": sentence}


def check(result):
    losses = result["losses"]
    assert len(losses) == STEPS, losses
    # It starts above chance (log 14, 14 word ids) and ends below it.
    assert np.mean(losses[-3:]) < 0.75 * losses[0], losses
    assert np.mean(losses[-3:]) < 0.95 * math.log(14), losses
    assert result["val_losses"][-1] < result["val_losses"][0], result["val_losses"]
    translation = result["translation"]
    assert translation[0] == 2 and 2 <= len(translation) <= len(result["sentence"]) + 2 + 5, translation
