"""Classifying names with a character-level RNN: an RNN module of three nn.Linear layers and
a LogSoftmax, run over a name one character at a time in a Python loop, NLLLoss on the last
output, and a hand-written SGD update (`p.data.add_(p.grad.data, alpha=-learning_rate)`).

Source: pytorch/tutorials, intermediate_source/char_rnn_classification_tutorial.py
(commit 10098032865151e891c6074522207880f0e68fd3, the version whose RNN is built from
nn.Linear layers).
Ported: `import tracegrad as torch`; the names (data/names/*.txt, one file per language)
are synthetic: each of four made-up categories spells its names with its own few letters,
drawn from a NumPy generator, which also replaces `random` in randomChoice; the model, the
helpers and `train` are the tutorial's, inside `main` so it can run again from given
weights; n_iters is the harness's step count; `train` is what is compiled (a name's length
is the length of the Python loop, so the compiled function holds one program per length);
the printing, plotting and confusion matrix are left out, and the evaluation counts
correct guesses instead.
"""

import string
import time
import unicodedata

import numpy as np

import tracegrad as torch
import tracegrad.nn as nn
import tracegrad.nn.functional as F

STEPS = 1000
COMPILED_RTOL = 1e-4
TORCH_RTOL = 1e-3

all_letters = string.ascii_letters + " .,;'"
n_letters = len(all_letters)

# Turn a Unicode string to plain ASCII, thanks to https://stackoverflow.com/a/518232/2809427
def unicodeToAscii(s):
    return ''.join(
        c for c in unicodedata.normalize('NFD', s)
        if unicodedata.category(c) != 'Mn'
        and c in all_letters
    )


def synthetic_category_lines(rng, n_names=50, lengths=(3, 4, 5)):
    """ the dataset: {category: [names ...]}, each category's names spelled from its own
    six letters (standing in for the files data/names/[Language].txt) """
    category_lines = {}
    all_categories = []
    for category, letters in [('Alpha', 'aeiklm'), ('Beta', 'bnorst'), ('Gamma', 'cdfghu'), ('Delta', 'jpqvwy')]:
        all_categories.append(category)
        names = []
        for _ in range(n_names):
            length = lengths[rng.integers(len(lengths))]
            name = ''.join(letters[i] for i in rng.integers(len(letters), size=length))
            names.append(unicodeToAscii(name.capitalize()))
        category_lines[category] = names
    return category_lines, all_categories


# Find letter index from all_letters, e.g. "a" = 0
def letterToIndex(letter):
    return all_letters.find(letter)

# Just for demonstration, turn a letter into a <1 x n_letters> Tensor
def letterToTensor(letter):
    tensor = torch.zeros(1, n_letters)
    tensor[0][letterToIndex(letter)] = 1
    return tensor

# Turn a line into a <line_length x 1 x n_letters>,
# or an array of one-hot letter vectors
def lineToTensor(line):
    tensor = torch.zeros(len(line), 1, n_letters)
    for li, letter in enumerate(line):
        tensor[li][0][letterToIndex(letter)] = 1
    return tensor


class RNN(nn.Module):
    def __init__(self, input_size, hidden_size, output_size):
        super(RNN, self).__init__()

        self.hidden_size = hidden_size

        self.i2h = nn.Linear(input_size, hidden_size)
        self.h2h = nn.Linear(hidden_size, hidden_size)
        self.h2o = nn.Linear(hidden_size, output_size)
        self.softmax = nn.LogSoftmax(dim=1)

    def forward(self, input, hidden):
        hidden = F.tanh(self.i2h(input) + self.h2h(hidden))
        output = self.h2o(hidden)
        output = self.softmax(output)
        return output, hidden

    def initHidden(self):
        return torch.zeros(1, self.hidden_size)


def main(steps=STEPS, compiled=False, init=None):
    category_lines, all_categories = synthetic_category_lines(np.random.default_rng(0))
    n_categories = len(all_categories)
    rng = np.random.default_rng(1)

    n_hidden = 128
    rnn = RNN(n_letters, n_hidden, n_categories)
    if init is not None:
        rnn.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in rnn.state_dict().items()}

    def categoryFromOutput(output):
        top_n, top_i = output.topk(1)
        category_i = top_i[0].item()
        return all_categories[category_i], category_i

    def randomChoice(l):
        return l[rng.integers(0, len(l))]

    def randomTrainingExample():
        category = randomChoice(all_categories)
        line = randomChoice(category_lines[category])
        category_tensor = torch.tensor([all_categories.index(category)], dtype=torch.long)
        line_tensor = lineToTensor(line)
        return category, line, category_tensor, line_tensor

    criterion = nn.NLLLoss()

    learning_rate = 0.005 # If you set this too high, it might explode. If too low, it might not learn

    def train(category_tensor, line_tensor):
        hidden = rnn.initHidden()

        rnn.zero_grad()

        for i in range(line_tensor.size()[0]):
            output, hidden = rnn(line_tensor[i], hidden)

        loss = criterion(output, category_tensor)
        loss.backward()

        # Add parameters' gradients to their values, multiplied by learning rate
        for p in rnn.parameters():
            p.data.add_(p.grad.data, alpha=-learning_rate)

        return output, loss.item()

    # Just return an output given a line
    def evaluate(line_tensor):
        hidden = rnn.initHidden()

        for i in range(line_tensor.size()[0]):
            output, hidden = rnn(line_tensor[i], hidden)

        return output

    step = torch.compile(train) if compiled else train
    losses, seconds = [], []
    for iter in range(1, steps + 1):
        category, line, category_tensor, line_tensor = randomTrainingExample()
        start_time = time.perf_counter()
        output, loss = step(category_tensor, line_tensor)
        seconds.append(time.perf_counter() - start_time)
        losses.append(loss)

    correct = 0
    n_confusion = 100
    with torch.no_grad():
        for i in range(n_confusion):
            category, line, category_tensor, line_tensor = randomTrainingExample()
            output = evaluate(line_tensor)
            guess, guess_i = categoryFromOutput(output)
            correct += guess == category
    return {"losses": losses, "init": start, "step_seconds": seconds, "accuracy": correct / n_confusion}


def check(result):
    losses = result["losses"]
    # four categories: a guess costs log(4) = 1.39 at first
    assert np.mean(losses[-50:]) < 0.8 * np.mean(losses[:50]), (np.mean(losses[:50]), np.mean(losses[-50:]))
    assert result["accuracy"] > 0.5, result["accuracy"]
