"""W7: a training step of a small GPT written as nanoGPT writes it (karpathy/nanoGPT
model.py with its attention written out: no flash path).

Token and position embeddings, 2 pre-LN blocks (LayerNorm, causal self-attention with
`masked_fill` over a `tril` buffer and `softmax`, LayerNorm, MLP with `nn.GELU`), a final
LayerNorm and a bias-free head whose weight is tied to the token embedding; cross-entropy
over the vocabulary; then nanoGPT's train loop body: `loss.backward()`,
`clip_grad_norm_(..., 1.0)`, AdamW (betas 0.9/0.95, weight decay 0.1 on the matrices only,
its two parameter groups) and `zero_grad(set_to_none=True)`. B=8, T=64, C=128, 4 heads,
vocabulary 65 (Shakespeare's characters); dropout 0. The step cycles through 8 fixed
batches drawn with NumPy.
"""

from __future__ import annotations

import math

import numpy as np
from workloads import _models

CASES = {"W7-gpt": "W7 GPT training step (nanoGPT, 2 blocks, B=8 T=64 C=128, AdamW)"}
PEERS = _models.LIBRARY_PEERS
CHECK_STEPS = _models.CHECK_STEPS
SIZES = {"batch": 8, "block": 64, "embd": 128, "head": 4, "layer": 2, "vocab": 65}
SMOKE_SIZES = {"batch": 2, "block": 8, "embd": 16, "head": 2, "layer": 1, "vocab": 11}
BATCHES = 8
LR = 1e-3
postprocess = _models.postprocess
check_floors = _models.check_floors


def program(torch):
    """The model class, written once for `torch` or `tracegrad as torch`."""
    nn = torch.nn
    F = torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self, config):
            super().__init__()
            assert config["embd"] % config["head"] == 0
            self.c_attn = nn.Linear(config["embd"], 3 * config["embd"])
            self.c_proj = nn.Linear(config["embd"], config["embd"])
            self.attn_dropout = nn.Dropout(0.0)
            self.resid_dropout = nn.Dropout(0.0)
            self.n_head = config["head"]
            self.n_embd = config["embd"]
            size = config["block"]
            self.register_buffer("bias", torch.tril(torch.ones(size, size)).view(1, 1, size, size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_dropout(att)
            y = att @ v
            y = y.transpose(1, 2).contiguous().view(B, T, C)
            return self.resid_dropout(self.c_proj(y))

    class MLP(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.c_fc = nn.Linear(config["embd"], 4 * config["embd"])
            self.gelu = nn.GELU()
            self.c_proj = nn.Linear(4 * config["embd"], config["embd"])
            self.dropout = nn.Dropout(0.0)

        def forward(self, x):
            return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))

    class Block(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.ln_1 = nn.LayerNorm(config["embd"])
            self.attn = CausalSelfAttention(config)
            self.ln_2 = nn.LayerNorm(config["embd"])
            self.mlp = MLP(config)

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            x = x + self.mlp(self.ln_2(x))
            return x

    class GPT(nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config
            self.transformer = nn.ModuleDict(dict(
                wte=nn.Embedding(config["vocab"], config["embd"]),
                wpe=nn.Embedding(config["block"], config["embd"]),
                drop=nn.Dropout(0.0),
                h=nn.ModuleList([Block(config) for _ in range(config["layer"])]),
                ln_f=nn.LayerNorm(config["embd"]),
            ))
            self.lm_head = nn.Linear(config["embd"], config["vocab"], bias=False)
            self.transformer.wte.weight = self.lm_head.weight  # weight tying

        def forward(self, idx, targets):
            b, t = idx.size()
            pos = torch.arange(0, t, dtype=torch.long)
            tok_emb = self.transformer.wte(idx)
            pos_emb = self.transformer.wpe(pos)
            x = self.transformer.drop(tok_emb + pos_emb)
            for block in self.transformer.h:
                x = block(x)
            x = self.transformer.ln_f(x)
            logits = self.lm_head(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
            return logits, loss

        def configure_optimizers(self, weight_decay, learning_rate, betas):
            params = [p for p in self.parameters() if p.requires_grad]
            decay = [p for p in params if p.dim() >= 2]
            no_decay = [p for p in params if p.dim() < 2]
            groups = [{"params": decay, "weight_decay": weight_decay},
                      {"params": no_decay, "weight_decay": 0.0}]
            return torch.optim.AdamW(groups, lr=learning_rate, betas=betas)

    return GPT


def _sizes(inputs: dict) -> dict:
    batches, batch, block = inputs["x"].shape
    smoke = block == SMOKE_SIZES["block"]
    return dict(SMOKE_SIZES if smoke else SIZES, batch=batch)


def make_inputs(case: str, smoke: bool) -> dict:
    sizes = SMOKE_SIZES if smoke else SIZES
    rng = np.random.default_rng(7)
    text = rng.integers(0, sizes["vocab"], 4096, dtype=np.int64)
    starts = rng.integers(0, len(text) - sizes["block"] - 1, (BATCHES, sizes["batch"]))
    x = np.stack([[text[i:i + sizes["block"]] for i in row] for row in starts])
    y = np.stack([[text[i + 1:i + 1 + sizes["block"]] for i in row] for row in starts])
    return {"x": x, "y": y}


def gemms(case: str, inputs: dict) -> list:
    """Forward and backward products: per block the qkv, output and two MLP linears on B*T
    rows, and attention's two batched products (B*heads of (T, hs) x (hs, T) and
    (T, T) x (T, hs)), each with its two backward products; the tied head on B*T rows.
    The embeddings are gathers, not products."""
    s = _sizes(inputs)
    rows, c, heads = s["batch"] * s["block"], s["embd"], s["head"]
    t, hs = s["block"], s["embd"] // s["head"]
    per_block = (_models.linear_gemms(rows, c, 3 * c) + _models.linear_gemms(rows, c, c)
                 + _models.linear_gemms(rows, c, 4 * c) + _models.linear_gemms(rows, 4 * c, c)
                 + 3 * [(1, s["batch"] * heads, t, hs, t)] + 3 * [(1, s["batch"] * heads, t, t, hs)])
    return s["layer"] * per_block + _models.linear_gemms(rows, c, s["vocab"])


def parameter_count(inputs: dict) -> int:
    s = _sizes(inputs)
    c = s["embd"]
    per_block = 4 * c + (3 * c * c + 3 * c) + (c * c + c) + (4 * c * c + 4 * c) + (4 * c * c + c)
    return s["vocab"] * c + s["block"] * c + s["layer"] * per_block + 2 * c


def min_bytes(case: str, inputs: dict) -> int:
    # AdamW reads and writes the parameters and both moments.
    return _models.state_bytes(parameter_count(inputs), 3, inputs["x"][0].nbytes * 2)


def make_model(torch, inputs: dict):
    return program(torch)(_sizes(inputs))


def build(peer: str, case: str, inputs: dict, dtype: str = "float32"):
    torch = _models.library(peer)
    model = make_model(torch, inputs)
    if dtype == "float64":
        model = model.double()
    _models.load_parameters(torch, model, seed=7, init=lambda name, shape: "normal")
    optimizer = model.configure_optimizers(weight_decay=0.1, learning_rate=LR, betas=(0.9, 0.95))
    batches = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in zip(inputs["x"], inputs["y"])]

    def train_step(x, y):
        logits, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    fn = _models.compile_step(torch, train_step, peer)
    state = {"i": 0}

    def step():
        x, y = batches[state["i"] % len(batches)]
        state["i"] += 1
        return {"loss": fn(x, y)}
    step.compiled = fn if peer == "tracegrad-compiled" else None
    return step
