"""Correct loss pairings: nn.LogSoftmax + nn.NLLLoss and nn.Sigmoid + nn.BCELoss; sorted validation loader without shuffle (correct)."""
import json
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.randn(600, 8)
y_cls = torch.bucketize(X[:, 0], torch.tensor([-0.6, 0.6]))
y_bin = (X[:, 1] + X[:, 2] > 0).float()
order = torch.argsort(y_cls)  # validation set stored sorted by label: fine for evaluation
Xv, yv_cls, yv_bin = X[order][:200], y_cls[order][:200], y_bin[order][:200]

trunk = nn.Sequential(nn.Linear(8, 32), nn.ReLU())
cls_head = nn.Sequential(nn.Linear(32, 3), nn.LogSoftmax(dim=1))
bin_head = nn.Sequential(nn.Linear(32, 1), nn.Sigmoid())
params = [*trunk.parameters(), *cls_head.parameters(), *bin_head.parameters()]
opt = torch.optim.Adam(params, lr=5e-3)
nll, bce = nn.NLLLoss(), nn.BCELoss()
train = DataLoader(TensorDataset(X, y_cls, y_bin), batch_size=50, shuffle=True)
val = DataLoader(TensorDataset(Xv, yv_cls, yv_bin), batch_size=50, shuffle=False)
for epoch in range(8):
    for xb, yc, yb in train:
        h = trunk(xb)
        loss = nll(cls_head(h), yc) + bce(bin_head(h).squeeze(1), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    total, correct = 0.0, 0
    with torch.no_grad():
        for xb, yc, yb in val:
            h = trunk(xb)
            total += (nll(cls_head(h), yc) + bce(bin_head(h).squeeze(1), yb)).item() * len(xb)
            correct += (cls_head(h).argmax(1) == yc).sum().item()
print("RESULT " + json.dumps({"val_loss": total / len(Xv), "val_cls_accuracy": correct / len(Xv)}))
