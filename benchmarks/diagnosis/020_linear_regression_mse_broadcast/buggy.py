import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)

# y = 3 x0 - 2 x1 + 0.5 x2 + 1 + noise, stored as a flat vector like a CSV column
X = torch.randn(1000, 3)
y = X @ torch.tensor([3.0, -2.0, 0.5]) + 1.0 + 0.1 * torch.randn(1000)
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)

model = nn.Sequential(nn.Linear(3, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for epoch in range(10):
    for xb, yb in loader:
        pred = model(xb)
        loss = F.mse_loss(pred, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")

with torch.no_grad():
    eval_mse = ((model(X).squeeze(1) - y) ** 2).mean().item()
print("RESULT " + json.dumps({"eval_mse": round(eval_mse, 4)}))
