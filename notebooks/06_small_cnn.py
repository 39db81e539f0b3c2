"""The small CNN of notebooks/06_importing_torch.ipynb and its loss, in a file of its own
so that the locations torch.export records (and anfir's dumps show) name a
stable file and line: ``notebooks/06_small_cnn.py``, not a kernel's temporary cell."""

from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """Two conv-bn-relu-pool stages and a linear classifier, for 1x8x8 images and 3 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 8, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.max_pool2d(torch.relu(self.bn1(self.conv1(x))), 2)
        h = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv2(h))), 2)
        return self.fc(torch.flatten(h, 1))


class CrossEntropy(nn.Module):
    """A model and its loss, exported together: the cross-entropy of its logits
    against one-hot labels (log_softmax, a product and two reductions)."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.net = net

    def forward(self, x: torch.Tensor, onehot: torch.Tensor) -> torch.Tensor:
        logits = self.net(x)
        return -(onehot * torch.log_softmax(logits, dim=1)).sum(dim=1).mean()
