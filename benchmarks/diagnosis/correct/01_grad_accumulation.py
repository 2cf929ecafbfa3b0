"""Gradient accumulation done right: loss / k, zero_grad and step every k micro-batches."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
X = torch.randn(1024, 8)
Y = (X[:, :3].sum(1) > 0).long()
loader = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True)

model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
accum_steps = 4
n_steps = 0

for epoch in range(4):
    optimizer.zero_grad()
    for i, (xb, yb) in enumerate(loader):
        loss = F.cross_entropy(model(xb), yb) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0 or i + 1 == len(loader):
            optimizer.step()
            optimizer.zero_grad()
            n_steps += 1
    print(f"epoch {epoch} loss {loss.item() * accum_steps:.4f}")

with torch.no_grad():
    logits = model(X)
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, Y).item(), 4), "optimizer_steps": n_steps,
                              "train_accuracy": round((logits.argmax(1) == Y).float().mean().item(), 4)}))
