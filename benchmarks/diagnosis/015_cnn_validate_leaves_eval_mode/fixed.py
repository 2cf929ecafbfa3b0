import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc(self.drop(self.body(x).flatten(1)))


def make_data(n, seed):
    """8x8 images; class 1 has a brighter centre. The brightness drifts over the dataset (sorted by time)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 2, (n,), generator=g)
    x[:, :, 2:6, 2:6] += y.view(-1, 1, 1, 1) * 1.5
    x += torch.linspace(0, 3, n).view(-1, 1, 1, 1)
    return x, y


def train_one_epoch(model, loader, optimizer):
    model.train()
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    return loss.item()


@torch.no_grad()
def validate(model, x, y):
    model.eval()
    return (model(x).argmax(1) == y).float().mean().item()


def main():
    torch.manual_seed(0)
    x, y = make_data(800, seed=0)
    vx, vy = make_data(200, seed=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = ConvNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    bn = model.body[1]
    for epoch in range(4):
        if epoch == 1:
            mean_after_first_epoch = bn.running_mean.clone()
        loss = train_one_epoch(model, loader, optimizer)
        acc = validate(model, vx, vy)
        print(f"epoch {epoch} loss {loss:.3f} val_acc {acc:.3f}")
    late_change = (bn.running_mean - mean_after_first_epoch).abs().max().item()
    print("RESULT " + json.dumps({"val_accuracy": round(acc, 4), "bn_running_mean_change_late": round(late_change, 5)}))


if __name__ == "__main__":
    main()
