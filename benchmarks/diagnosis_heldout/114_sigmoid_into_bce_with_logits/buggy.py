import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Tagger(nn.Module):
    def __init__(self, d_in=16, n_tags=6):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, 64), nn.ReLU(), nn.Linear(64, n_tags))

    def forward(self, x):
        return torch.sigmoid(self.body(x))

    def predict_proba(self, x):
        return self(x)


def train_one_epoch(model, loader, opt, loss_fn):
    model.train()
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
    return loss.item()


def main():
    torch.manual_seed(0)
    W = torch.randn(16, 6)
    def make(n):
        x = torch.randn(n, 16)
        p = torch.sigmoid(x @ W * 0.7)
        return x, torch.bernoulli(p)
    xtr, ytr = make(512)
    xva, yva = make(512)
    model = Tagger()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=64, shuffle=True)
    loss_fn = nn.BCEWithLogitsLoss()
    for epoch in range(15):
        train_loss = train_one_epoch(model, loader, opt, loss_fn)
    model.eval()
    with torch.no_grad():
        probs = model.predict_proba(xva).clamp(1e-6, 1 - 1e-6)
        val_bce = F.binary_cross_entropy(probs, yva).item()
        val_acc = ((probs > 0.5).float() == yva).float().mean().item()
    print("RESULT " + json.dumps({"val_bce": val_bce, "val_accuracy": val_acc, "train_loss": train_loss}))


if __name__ == "__main__":
    main()
