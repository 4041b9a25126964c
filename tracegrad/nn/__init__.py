"""`tg.nn`: Module, Parameter, layers, losses, `init` and `functional`."""

from tracegrad.nn import functional, init, utils  # noqa: F401
from tracegrad.nn.activation import GELU, LogSoftmax, ReLU, Sigmoid, Softmax, Tanh  # noqa: F401
from tracegrad.nn.attention import MultiheadAttention  # noqa: F401
from tracegrad.nn.container import ModuleList, Sequential  # noqa: F401
from tracegrad.nn.conv import AvgPool2d, Conv2d, MaxPool2d  # noqa: F401
from tracegrad.nn.layers import Dropout, Embedding, Flatten, Identity, Linear  # noqa: F401
from tracegrad.nn.loss import BCEWithLogitsLoss, CrossEntropyLoss, MSELoss  # noqa: F401
from tracegrad.nn.module import Module  # noqa: F401
from tracegrad.nn.normalization import BatchNorm1d, BatchNorm2d, LayerNorm  # noqa: F401
from tracegrad.nn.parameter import Parameter  # noqa: F401
from tracegrad.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase  # noqa: F401
from tracegrad.nn.transformer import (  # noqa: F401
    Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer,
)
