import json
import math

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)

# Three overlapping gaussian blobs in 2-D.
centers = torch.tensor([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]])
n_per_class = 300
X = torch.cat([torch.randn(n_per_class, 2) * 0.9 + c for c in centers])
y = torch.arange(3).repeat_interleave(n_per_class)

loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True)

model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 3))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

for epoch in range(6):
    running = 0.0
    for xb, yb in loader:
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
        running += loss.item() * len(xb)
    print(f"epoch {epoch}: train loss {running / len(X):.4f}")

with torch.no_grad():
    logits = model(X)
    final_loss = criterion(logits, y).item()
    acc = (logits.argmax(1) == y).float().mean().item()

finite = math.isfinite(final_loss)
print("RESULT " + json.dumps({"final_loss": round(final_loss, 4) if finite else 1e6,
                              "loss_finite": finite, "train_accuracy": round(acc, 4)}))
