import json
import math
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
N = 800
X = torch.randn(N, 7)
y = ((X[:, 0] - X[:, 3] + 0.5 * X[:, 5]) > 0).float()
missing = torch.rand(N, 7) < 0.02      # ~2% of cells missing in the "CSV"
X[missing] = float("nan")

loader = DataLoader(TensorDataset(X, y), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(7, 16), nn.ReLU(), nn.Linear(16, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.BCEWithLogitsLoss()
for epoch in range(5):
    for xb, yb in loader:
        opt.zero_grad()
        loss = loss_fn(model(xb).squeeze(1), yb)
        loss.backward()
        opt.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")

final = loss.item()
finite = math.isfinite(final)
print("RESULT " + json.dumps({"final_loss": final if finite else -1.0, "finite": finite}))
