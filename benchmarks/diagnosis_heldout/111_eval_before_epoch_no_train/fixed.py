import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_data(n, gen):
    x = torch.randn(n, 6, generator=gen)
    y = ((x[:, 0] + x[:, 1] * x[:, 2]) > 0).long()
    x = x * torch.tensor([50.0, 20.0, 30.0, 1.0, 80.0, 5.0]) + torch.tensor([300.0, -40.0, 10.0, 0.0, 150.0, 7.0])
    return x, y


@torch.no_grad()
def evaluate(model, x, y):
    model.eval()
    logits = model(x)
    return F.cross_entropy(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    xtr, ytr = make_data(512, gen)
    xva, yva = make_data(256, gen)
    model = nn.Sequential(
        nn.Linear(6, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1),
        nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(),
        nn.Linear(64, 2))
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=64, shuffle=True)
    for epoch in range(15):
        val_loss, val_acc = evaluate(model, xva, yva)
        print(f"epoch {epoch} val_loss {val_loss:.4f} val_acc {val_acc:.3f}")
        model.train()
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
    val_loss, val_acc = evaluate(model, xva, yva)
    finite = val_loss == val_loss and abs(val_loss) < float("inf")
    print("RESULT " + json.dumps({"val_loss": val_loss if finite else 1e9, "val_accuracy": val_acc, "finite": finite}))


if __name__ == "__main__":
    main()
