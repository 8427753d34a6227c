"""A model that costs almost nothing, for measuring what serving itself costs (`bench-sidecar --model identity`).

It averages each image's pixels and maps the three channel means to ten logits: the sidecar's work per
request (sockets, Arrow, batching, heads, replies) is then nearly all there is. Inputs are 32x32 so that
moving pixels costs little too, and the per-request cost shows.
"""

from __future__ import annotations

from torch import nn

IDENTITY_FACTORY = "spark_cnn.bench.tiny:identity_classifier"


class IdentityClassifier(nn.Module):
    spark_cnn_preprocessing = {"resize": 32, "crop": 32}

    def __init__(self, classes: int = 10):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(3, classes)

    def forward(self, images):
        return self.head(self.pool(images).flatten(1))


def identity_classifier() -> nn.Module:
    return IdentityClassifier()
