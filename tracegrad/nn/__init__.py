"""`tg.nn`: Module, Parameter, layers, losses, `init` and `functional`."""

from tracegrad.nn import functional, init, parallel, utils  # noqa: F401
from tracegrad.nn.activation import (  # noqa: F401
    CELU, ELU, GELU, GLU, SELU, Hardsigmoid, Hardswish, Hardtanh, LeakyReLU, LogSigmoid, LogSoftmax,
    Mish, PReLU, ReLU, ReLU6, Sigmoid, SiLU, Softmax, Softmin, Softplus, Softsign, Tanh, Threshold,
)
from tracegrad.nn.attention import MultiheadAttention  # noqa: F401
from tracegrad.nn.container import ModuleDict, ModuleList, ParameterDict, ParameterList, Sequential  # noqa: F401
from tracegrad.nn.conv import AvgPool2d, Conv1d, Conv2d, ConvTranspose1d, ConvTranspose2d, MaxPool2d  # noqa: F401
from tracegrad.nn.distance import CosineSimilarity, PairwiseDistance  # noqa: F401
from tracegrad.nn.dropout import AlphaDropout, Dropout1d, Dropout2d, Dropout3d  # noqa: F401
from tracegrad.nn.layers import Bilinear, Dropout, Embedding, Flatten, Identity, Linear, Unflatten  # noqa: F401
from tracegrad.nn.loss import (  # noqa: F401
    BCELoss, BCEWithLogitsLoss, CosineEmbeddingLoss, CrossEntropyLoss, GaussianNLLLoss, HuberLoss,
    KLDivLoss, L1Loss, MarginRankingLoss, MSELoss, MultiMarginLoss, NLLLoss, PoissonNLLLoss,
    SmoothL1Loss, TripletMarginLoss,
)
from tracegrad.nn.module import Module  # noqa: F401
from tracegrad.nn.normalization import (  # noqa: F401
    BatchNorm1d, BatchNorm2d, GroupNorm, InstanceNorm1d, InstanceNorm2d, InstanceNorm3d, LayerNorm,
    LocalResponseNorm, RMSNorm,
)
from tracegrad.nn.padding import (  # noqa: F401
    CircularPad1d, CircularPad2d, CircularPad3d, ConstantPad1d, ConstantPad2d, ConstantPad3d,
    ReflectionPad1d, ReflectionPad2d, ReflectionPad3d, ReplicationPad1d, ReplicationPad2d,
    ReplicationPad3d, ZeroPad1d, ZeroPad2d, ZeroPad3d,
)
from tracegrad.nn.parameter import Parameter  # noqa: F401
from tracegrad.nn.pooling import (  # noqa: F401
    AdaptiveAvgPool1d, AdaptiveAvgPool2d, AdaptiveMaxPool1d, AdaptiveMaxPool2d, AvgPool1d, MaxPool1d,
)
from tracegrad.nn.resample import (  # noqa: F401
    Fold, PixelShuffle, PixelUnshuffle, Unfold, Upsample, UpsamplingBilinear2d, UpsamplingNearest2d,
)
from tracegrad.nn.rnn import GRU, LSTM, RNN, GRUCell, LSTMCell, RNNBase, RNNCell, RNNCellBase  # noqa: F401
from tracegrad.nn.transformer import (  # noqa: F401
    Transformer, TransformerDecoder, TransformerDecoderLayer, TransformerEncoder, TransformerEncoderLayer,
)
from tracegrad.nn import modules  # noqa: F401,E402  (last: its namespaces name the classes above)
