"""Distance layers: CosineSimilarity and PairwiseDistance (over the composites in
`tracegrad.functional.distance`)."""

from __future__ import annotations

from tracegrad.nn import functional as nnF
from tracegrad.nn.module import Module
from tracegrad.tensor import Tensor


class CosineSimilarity(Module):
    def __init__(self, dim: int = 1, eps: float = 1e-8):
        super().__init__()
        self.dim, self.eps = dim, eps

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return nnF.cosine_similarity(x1, x2, self.dim, self.eps)


class PairwiseDistance(Module):
    def __init__(self, p: float = 2.0, eps: float = 1e-6, keepdim: bool = False):
        super().__init__()
        self.norm, self.eps, self.keepdim = p, eps, keepdim

    def forward(self, x1: Tensor, x2: Tensor) -> Tensor:
        return nnF.pairwise_distance(x1, x2, self.norm, self.eps, self.keepdim)
