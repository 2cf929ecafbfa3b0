import json

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)

n_classes = 5
centers = torch.randn(n_classes, 4) * 3
X = torch.cat([c + torch.randn(200, 4) for c in centers])
y = torch.arange(n_classes).repeat_interleave(200)
loader = DataLoader(TensorDataset(X, y), batch_size=50, shuffle=True)

model = nn.Sequential(
    nn.Linear(4, 32), nn.ReLU(),
    nn.Linear(32, n_classes),
)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

for epoch in range(10):
    total = 0.0
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = criterion(model(xb), yb)
        loss.backward()
        optimizer.step()
        total += loss.item()
    print(f"epoch {epoch}: {total / len(loader):.4f}")

with torch.no_grad():
    out = model(X)
print("RESULT " + json.dumps({"final_loss": round(criterion(out, y).item(), 4),
                              "train_accuracy": round((out.argmax(1) == y).float().mean().item(), 4)}))
