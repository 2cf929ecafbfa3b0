"""Regression where the (N,) target is unsqueezed to (N, 1) to match the model output before mse_loss."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.rand(1000, 2) * 4 - 2
y = torch.sin(X[:, 0]) * X[:, 1]  # shape (N,)
loader = DataLoader(TensorDataset(X, y), batch_size=50, shuffle=True)

model = nn.Sequential(nn.Linear(2, 64), nn.SiLU(), nn.Linear(64, 64), nn.SiLU(), nn.Linear(64, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
for epoch in range(10):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb.unsqueeze(1))
        loss.backward()
        optimizer.step()
with torch.no_grad():
    mse = F.mse_loss(model(X), y.unsqueeze(1)).item()
print("RESULT " + json.dumps({"eval_mse": round(mse, 5), "target_variance": round(y.var().item(), 4)}))
