"""Gradient accumulation over 4 micro-batches with a per-optimizer-step LR schedule (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ACCUM = 4
torch.manual_seed(0)
X = torch.randn(512, 12)
y = (X[:, :3].sum(1) > 0).long() + (X[:, 3] > 0.8).long()
loader = DataLoader(TensorDataset(X, y), batch_size=16, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 3))
opt = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=1e-2)
epochs = 6
total_updates = epochs * (len(loader) // ACCUM)
sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=5e-3, total_steps=total_updates)
opt.zero_grad()
for epoch in range(epochs):
    model.train()
    for i, (xb, yb) in enumerate(loader):
        loss = F.cross_entropy(model(xb), yb) / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:
            opt.step()
            sched.step()
            opt.zero_grad()
model.eval()
with torch.no_grad():
    acc = (model(X).argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "updates": sched.last_epoch}))
