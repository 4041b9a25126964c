"""Channel-wise dropout layers Dropout1d/2d/3d (one draw per sample and channel) and
AlphaDropout (for SELU networks); the identity in eval mode, like `Dropout`."""

from __future__ import annotations

from tracegrad.nn import functional as nnF
from tracegrad.nn.layers import Dropout
from tracegrad.tensor import Tensor


class Dropout1d(Dropout):
    def forward(self, input: Tensor) -> Tensor:
        return nnF.dropout1d(input, self.p, self.training, self.inplace)


class Dropout2d(Dropout):
    def forward(self, input: Tensor) -> Tensor:
        return nnF.dropout2d(input, self.p, self.training, self.inplace)


class Dropout3d(Dropout):
    def forward(self, input: Tensor) -> Tensor:
        return nnF.dropout3d(input, self.p, self.training, self.inplace)


class AlphaDropout(Dropout):
    def forward(self, input: Tensor) -> Tensor:
        return nnF.alpha_dropout(input, self.p, self.training)
