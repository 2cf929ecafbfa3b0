import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
C, D, PER_CLASS = 4, 10, 150
centers = torch.randn(C, D) * 0.6
xs, ys = [], []
for c in range(C):  # data arrives grouped by class, as from per-class folders
    xs.append(centers[c] + torch.randn(PER_CLASS, D))
    ys.append(torch.full((PER_CLASS,), c))
X, Y = torch.cat(xs), torch.cat(ys)

loader = DataLoader(TensorDataset(X, Y), batch_size=30, shuffle=False)
model = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, C))
opt = torch.optim.SGD(model.parameters(), lr=0.3)
for epoch in range(5):
    for xb, yb in loader:
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()

yv = torch.randint(0, C, (1000,))
xv = centers[yv] + torch.randn(1000, D)
with torch.no_grad():
    acc = (model(xv).argmax(1) == yv).float().mean().item()
print("RESULT " + json.dumps({"val_accuracy": acc, "final_loss": loss.item()}))
