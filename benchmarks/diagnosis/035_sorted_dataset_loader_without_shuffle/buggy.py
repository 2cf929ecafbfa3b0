import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def load_dataset(n_per_class=400, seed=0):
    """Three classes of 6-D points; the 'file' lists all class-0 rows, then class 1, then class 2."""
    g = torch.Generator().manual_seed(seed)
    centers = torch.tensor([[1.0, 0, 0, 0, 0, 0], [0, 1.0, 0, 0, 0, 0], [0, 0, 1.0, 0, 0, 0]]) * 2
    xs = [c + torch.randn(n_per_class, 6, generator=g) for c in centers]
    ys = [torch.full((n_per_class,), k) for k in range(3)]
    return torch.cat(xs), torch.cat(ys)


torch.manual_seed(0)
x, y = load_dataset()
x_test, y_test = load_dataset(200, seed=1)
train_loader = DataLoader(TensorDataset(x, y), batch_size=40, shuffle=False)

model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
for epoch in range(5):
    for xb, yb in train_loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} last batch loss {loss.item():.3f}")

with torch.no_grad():
    pred = model(x_test).argmax(1)
print("RESULT " + json.dumps({"test_accuracy": round((pred == y_test).float().mean().item(), 4),
                              "predicted_class_share_max": round(pred.bincount(minlength=3).max().item() / len(pred), 4)}))
