"""Shared trunk with nn.ModuleDict heads: label-smoothed classification + regression; a head is skipped on some steps (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(10, 64), nn.GELU(), nn.LayerNorm(64))
        self.heads = nn.ModuleDict({"cls": nn.Linear(64, 3), "reg": nn.Linear(64, 1)})

    def forward(self, x, tasks):
        h = self.trunk(x)
        return {t: self.heads[t](h) for t in tasks}


torch.manual_seed(0)
X = torch.randn(600, 10)
y_cls = torch.bucketize(X[:, 0] + X[:, 1], torch.tensor([-0.5, 0.5]))
y_reg = (X[:, 2] * 2 - X[:, 3]).unsqueeze(1)
model = MultiTask()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
ce = nn.CrossEntropyLoss(label_smoothing=0.1)
for step in range(200):
    idx = torch.randint(0, 600, (48,))
    tasks = ["cls", "reg"] if step % 2 == 0 else ["cls"]
    out = model(X[idx], tasks)
    loss = ce(out["cls"], y_cls[idx])
    if "reg" in out:
        loss = loss + F.mse_loss(out["reg"], y_reg[idx])
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    out = model(X, ["cls", "reg"])
    acc = (out["cls"].argmax(1) == y_cls).float().mean().item()
    mse = F.mse_loss(out["reg"], y_reg).item()
print("RESULT " + json.dumps({"cls_accuracy": acc, "reg_mse": mse}))
