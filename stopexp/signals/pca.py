"""PCA of one tapped layer's hidden state (predictor.pca_components=k), an input of linear,
mlp and hidden_conf in place of their LayerNorm: each of the H components is standardised
by its mean and standard deviation over the training rows, the result projected onto the
k leading eigenvectors of their covariance, and each projection divided by its standard
deviation (whitened), so the head reads k uncorrelated inputs of unit variance.

Few training prompts and a wide hidden state let a head fit each prompt's own directions;
k directions of the largest shared variance are a way to give it fewer. The projection is
fitted once, before training, on the training rows only (`fit`, from the train stage;
centred first where the predictor centres: what it is applied to), never on validation or
test rows; its buffers are part of the predictor's state, so the checkpoint carries it and
scoring uses the same projection.
"""
from __future__ import annotations

import torch
from torch import nn

EPS = 1e-6  # a standard deviation below this (a constant component) divides by it instead


class PCA(nn.Module):
    """x (B, H) -> (B, k): standardised, projected on the k leading principal axes, whitened."""

    def __init__(self, size: int, k: int):
        super().__init__()
        if not 1 <= k <= size:
            raise ValueError(f"predictor.pca_components: {k} must lie in 1..{size}, the hidden "
                             "size of the tapped layer")
        self.k = k
        self.register_buffer("mean", torch.zeros(size))
        self.register_buffer("scale", torch.ones(size))
        self.register_buffer("axes", torch.zeros(size, k))
        self.register_buffer("spread", torch.ones(k))
        self.register_buffer("fitted", torch.zeros(1, dtype=torch.bool))

    @torch.no_grad()
    def fit(self, x: torch.Tensor) -> "PCA":
        """Fit on the training rows `x` (N, H), N >= 2, in float64: the axes are the
        eigenvectors of the standardised rows' covariance, largest eigenvalue first, each
        signed so that its largest component is positive (the same axes for the same
        rows)."""
        x = x.detach().to(torch.float64).cpu()
        if len(x) < 2:
            raise ValueError(f"predictor.pca_components: PCA needs at least 2 training rows, got {len(x)}")
        mean = x.mean(0)
        scale = x.std(0, correction=0).clamp(min=EPS)
        z = (x - mean) / scale
        values, vectors = torch.linalg.eigh(z.T @ z / len(z))  # ascending
        values, vectors = values.flip(0)[: self.k], vectors.flip(1)[:, : self.k]
        signs = torch.sign(vectors.gather(0, vectors.abs().argmax(0, keepdim=True)))
        self.mean.copy_(mean)
        self.scale.copy_(scale)
        self.axes.copy_(vectors * signs)
        self.spread.copy_(values.clamp(min=0).sqrt().clamp(min=EPS))
        self.fitted.fill_(True)
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not bool(self.fitted):
            raise RuntimeError("predictor.pca_components: the PCA projection was never fitted; "
                               "the train stage fits it on the training rows before training")
        z = (x.float() - self.mean.float()) / self.scale.float()
        return z @ self.axes.float() / self.spread.float()
