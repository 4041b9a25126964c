"""`tg.nn.modules`: the submodule paths PyTorch defines its layers under
(`torch.nn.modules.linear.Linear`, `...rnn.LSTM`), which programs name when they allow-list
classes for loading or check types. Each is a namespace of the classes `tg.nn` defines."""

from __future__ import annotations

import types

from tracegrad import nn as _nn
from tracegrad.nn.layers import Linear


class NonDynamicallyQuantizableLinear(Linear):
    """PyTorch's class of MultiheadAttention's output projection: a Linear."""


_LAYOUT = {
    "activation": ["CELU", "ELU", "GELU", "GLU", "Hardsigmoid", "Hardswish", "Hardtanh", "LeakyReLU",
                   "LogSigmoid", "LogSoftmax", "Mish", "MultiheadAttention", "PReLU", "ReLU", "ReLU6", "SELU",
                   "SiLU", "Sigmoid", "Softmax", "Softmin", "Softplus", "Softsign", "Tanh", "Threshold"],
    "container": ["ModuleDict", "ModuleList", "ParameterDict", "ParameterList", "Sequential"],
    "conv": ["Conv1d", "Conv2d", "ConvTranspose1d", "ConvTranspose2d"],
    "dropout": ["AlphaDropout", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d"],
    "linear": ["Bilinear", "Identity", "Linear"],
    "loss": ["BCELoss", "BCEWithLogitsLoss", "CrossEntropyLoss", "HuberLoss", "KLDivLoss", "L1Loss", "MSELoss",
             "NLLLoss", "SmoothL1Loss"],
    "module": ["Module"],
    "normalization": ["GroupNorm", "LayerNorm", "LocalResponseNorm", "RMSNorm"],
    "batchnorm": ["BatchNorm1d", "BatchNorm2d"],
    "pixelshuffle": ["PixelShuffle", "PixelUnshuffle"],
    "pooling": ["AdaptiveAvgPool1d", "AdaptiveAvgPool2d", "AdaptiveMaxPool1d", "AdaptiveMaxPool2d", "AvgPool1d",
                "AvgPool2d", "MaxPool1d", "MaxPool2d"],
    "rnn": ["GRU", "GRUCell", "LSTM", "LSTMCell", "RNN", "RNNBase", "RNNCell", "RNNCellBase"],
    "sparse": ["Embedding"],
    "transformer": ["Transformer", "TransformerDecoder", "TransformerDecoderLayer", "TransformerEncoder",
                    "TransformerEncoderLayer"],
    "flatten": ["Flatten", "Unflatten"],
}


def _namespace(name: str, classes: list[str]) -> types.ModuleType:
    module = types.ModuleType(f"{__name__}.{name}", f"tg.nn.modules.{name}: {', '.join(classes)}")
    for cls in classes:
        setattr(module, cls, getattr(_nn, cls))
    return module


for _name, _classes in _LAYOUT.items():
    globals()[_name] = _namespace(_name, _classes)
linear.NonDynamicallyQuantizableLinear = NonDynamicallyQuantizableLinear  # noqa: F821 (made just above)
for _classes in _LAYOUT.values():
    for _cls in _classes:
        globals()[_cls] = getattr(_nn, _cls)
del _name, _classes, _cls
