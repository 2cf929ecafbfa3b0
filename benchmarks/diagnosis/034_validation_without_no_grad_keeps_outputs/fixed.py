import json
import resource

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class MLP(nn.Module):
    def __init__(self, d_in=20, width=2048, n_classes=3):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, width), nn.ReLU(), nn.Dropout(0.1), nn.Linear(width, n_classes))

    def forward(self, x):
        return self.net(x)


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    outputs, targets = [], []
    for xb, yb in loader:
        outputs.append(model(xb))
        targets.append(yb)
    logits, targets = torch.cat(outputs), torch.cat(targets)
    return logits, (logits.argmax(1) == targets).float().mean().item()


def main():
    torch.manual_seed(0)
    w = torch.randn(20, 3)
    x = torch.randn(5000, 20)
    y = (x @ w).argmax(1)
    train = DataLoader(TensorDataset(x[:1000], y[:1000]), batch_size=50, shuffle=True)
    val = DataLoader(TensorDataset(x[1000:], y[1000:]), batch_size=100)
    model = MLP()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    for epoch in range(3):
        model.train()
        for xb, yb in train:
            optimizer.zero_grad()
            F.cross_entropy(model(xb), yb).backward()
            optimizer.step()
        logits, acc = evaluate(model, val)
        print(f"epoch {epoch} val_acc {acc:.3f}")
    rss_growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - rss_before
    print("RESULT " + json.dumps({"val_accuracy": round(acc, 4), "val_outputs_detached": not logits.requires_grad,
                                  "rss_growth_mb": round(rss_growth, 1)}))


if __name__ == "__main__":
    main()
