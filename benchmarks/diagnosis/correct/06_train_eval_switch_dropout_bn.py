"""Dropout + BatchNorm model: model.eval() + no_grad for validation every epoch, model.train() again after."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Classifier(nn.Module):
    def __init__(self, d_in=12, n_classes=3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3),
            nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.3),
            nn.Linear(64, n_classes),
        )

    def forward(self, x):
        return self.net(x)


def train_one_epoch(model, loader, optimizer):
    model.train()
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    return loss.item()


@torch.no_grad()
def validate(model, loader):
    model.eval()
    correct = total = 0
    for xb, yb in loader:
        correct += (model(xb).argmax(1) == yb).sum().item()
        total += len(yb)
    return correct / total


def main():
    torch.manual_seed(0)
    w = torch.randn(12, 3)
    x = torch.randn(1500, 12) * 3 + 1
    y = (x @ w).argmax(1)
    train = DataLoader(TensorDataset(x[:1200], y[:1200]), batch_size=64, shuffle=True)
    val = DataLoader(TensorDataset(x[1200:], y[1200:]), batch_size=100)
    model = Classifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(6):
        loss = train_one_epoch(model, train, optimizer)
        acc = validate(model, val)
        print(f"epoch {epoch} loss {loss:.3f} val_acc {acc:.3f}")
    print("RESULT " + json.dumps({"val_accuracy": round(acc, 4), "last_train_loss": round(loss, 4)}))


if __name__ == "__main__":
    main()
