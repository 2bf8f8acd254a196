"""resnet.py: the ResNet cddp_nn_resnet builds (src/nn/resnet.c), in PyTorch, for the reference
values (make_fixtures.py) and the benchmarks (bench/mlp_torch.py)."""
import torch
from torch import nn


class BasicBlock(nn.Module):
    """torchvision's BasicBlock (PyTorch's default initialisation)."""

    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (self.downsample(x) if self.downsample is not None else x))


class ResNet(nn.Module):
    """cddp_nn_resnet: a 3x3 stem, stages of basic blocks (stride 2 after the first), global
    average pooling, fc."""

    def __init__(self, cin=1, widths=(4, 8), blocks=1, classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, widths[0], 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(widths[0])
        prev = widths[0]
        for s, w in enumerate(widths):
            layer = nn.Sequential(*[BasicBlock(prev if k == 0 else w, w, 2 if k == 0 and s else 1)
                                    for k in range(blocks)])
            setattr(self, f"layer{s + 1}", layer)
            prev = w
        self.stages = len(widths)
        self.fc = nn.Linear(prev, classes)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        for s in range(self.stages):
            x = getattr(self, f"layer{s + 1}")(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))
