import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)

# Tabular data with raw (un-normalised) features: the BatchNorm layer is what normalises them.
n, d = 1500, 6
scales = torch.tensor([50.0, 0.02, 300.0, 1.0, 8.0, 1000.0])
offsets = torch.tensor([200.0, 0.5, -900.0, 3.0, 40.0, 5000.0])
z = torch.randn(n, d)
X = z * scales + offsets
y = ((z[:, 0] * z[:, 2] > 0) ^ (z[:, 5] > 0.5)).long()
loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)

model = nn.Sequential(
    nn.BatchNorm1d(d),
    nn.Linear(d, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1),
    nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Dropout(0.1),
    nn.Linear(64, 2),
)

# sanity check of the output shape
model.eval()
with torch.no_grad():
    print("output shape:", tuple(model(X[:4]).shape))

optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for epoch in range(8):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.3f}")

model.eval()
with torch.no_grad():
    logits = model(X)
print("RESULT " + json.dumps({"final_loss": round(min(F.cross_entropy(logits, y).item(), 1e6), 4),
                              "train_accuracy": round((logits.argmax(1) == y).float().mean().item(), 4)}))
