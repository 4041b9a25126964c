"""A bidirectional two-layer LSTM classifier reading 28x28 images row by row (many-to-one):
the last time step's output of both directions goes through a linear layer, cross entropy,
Adam.

Source: yunjey/pytorch-tutorial, tutorials/02-intermediate/bidirectional_recurrent_neural_network/main.py
(commit 0500d3d, 2020-07-06).
Ported: `import tracegrad as torch` (and its `nn`); the MNIST datasets (torchvision) are
`TensorDataset`s of synthetic 28x28 digits (ten fixed random stroke images plus noise) from
a NumPy generator; the module-level script is `main` in a reduced configuration (hidden size
16, batch 20, learning rate 0.01, one epoch of `steps` batches, log every 4 steps); the body of the training
loop is `train_step` so it can be compiled.
"""

import time

import numpy as np

import tracegrad as torch
import tracegrad.nn as nn
import tracegrad.utils.data

STEPS = 16
COMPILED_RTOL = 1e-4
TORCH_RTOL = 1e-3

# Device configuration
device = torch.device('cuda' if torch.cuda.is_available() else 'cpu')

# Hyper-parameters
sequence_length = 28
input_size = 28
hidden_size = 16
num_layers = 2
num_classes = 10
batch_size = 20
num_epochs = 1
learning_rate = 0.01

_templates = np.random.default_rng(0).random((num_classes, 28, 28)) < 0.15


def synthetic_digits(rng, n):
    """n 28x28 grey images (in [0, 1], as ToTensor gives) of the ten template 'digits' with
    pixel noise, and their labels."""
    labels = rng.integers(0, num_classes, n)
    images = np.clip(_templates[labels] * 0.9 + rng.random((n, 28, 28)) * 0.4, 0, 1)
    return (torch.tensor(images[:, None].astype(np.float32)), torch.tensor(labels))


# Bidirectional recurrent neural network (many-to-one)
class BiRNN(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, num_classes):
        super(BiRNN, self).__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, bidirectional=True)
        self.fc = nn.Linear(hidden_size*2, num_classes)  # 2 for bidirection
    
    def forward(self, x):
        # Set initial states
        h0 = torch.zeros(self.num_layers*2, x.size(0), self.hidden_size).to(device) # 2 for bidirection 
        c0 = torch.zeros(self.num_layers*2, x.size(0), self.hidden_size).to(device)
        
        # Forward propagate LSTM
        out, _ = self.lstm(x, (h0, c0))  # out: tensor of shape (batch_size, seq_length, hidden_size*2)
        
        # Decode the hidden state of the last time step
        out = self.fc(out[:, -1, :])
        return out


def train_step(model, criterion, optimizer, images, labels):
    # Forward pass
    outputs = model(images)
    loss = criterion(outputs, labels)
    
    # Backward and optimize
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss


def main(steps=STEPS, compiled=False, init=None):
    rng = np.random.default_rng(1)
    train_dataset = torch.utils.data.TensorDataset(*synthetic_digits(rng, steps * batch_size))
    test_dataset = torch.utils.data.TensorDataset(*synthetic_digits(rng, 100))

    # Data loader
    train_loader = torch.utils.data.DataLoader(dataset=train_dataset,
                                               batch_size=batch_size, 
                                               shuffle=False)

    test_loader = torch.utils.data.DataLoader(dataset=test_dataset,
                                              batch_size=batch_size, 
                                              shuffle=False)

    model = BiRNN(input_size, hidden_size, num_layers, num_classes).to(device)
    if init is not None:
        model.load_state_dict({k: torch.tensor(v) for k, v in init.items()})
    start = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}

    # Loss and optimizer
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=learning_rate)

    step = torch.compile(train_step) if compiled else train_step
    losses, seconds, printed = [], [], []
    # Train the model
    total_step = len(train_loader)
    for epoch in range(num_epochs):
        for i, (images, labels) in enumerate(train_loader):
            images = images.reshape(-1, sequence_length, input_size).to(device)
            labels = labels.to(device)

            start_time = time.perf_counter()
            loss = step(model, criterion, optimizer, images, labels)
            losses.append(loss.item())
            seconds.append(time.perf_counter() - start_time)

            if (i+1) % 4 == 0:
                printed.append('Epoch [{}/{}], Step [{}/{}], Loss: {:.4f}' 
                               .format(epoch+1, num_epochs, i+1, total_step, loss.item()))

    # Test the model
    with torch.no_grad():
        correct = 0
        total = 0
        for images, labels in test_loader:
            images = images.reshape(-1, sequence_length, input_size).to(device)
            labels = labels.to(device)
            outputs = model(images)
            _, predicted = torch.max(outputs.data, 1)
            total += labels.size(0)
            correct += (predicted == labels).sum().item()

    return {"losses": losses, "init": start, "step_seconds": seconds, "printed": printed,
            "accuracy": correct / total}


def check(result):
    losses = result["losses"]
    assert len(losses) == STEPS, losses
    assert np.mean(losses[-3:]) < losses[0] * 0.9, losses
    assert result["accuracy"] >= 0.3, result["accuracy"]
    assert result["printed"][0].startswith("Epoch [1/1], Step [4/16], Loss: "), result["printed"]
