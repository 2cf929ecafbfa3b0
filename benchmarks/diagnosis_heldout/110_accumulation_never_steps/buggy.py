import json
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

ACCUM_STEPS = 8

torch.manual_seed(0)
X = torch.randn(384, 12)
y = (X[:, 0] * X[:, 1] > 0).long() + (X[:, 2] > 0.5).long()
train = DataLoader(TensorDataset(X[:192], y[:192]), batch_size=32, shuffle=True)
Xv, yv = X[192:], y[192:]

model = nn.Sequential(nn.Linear(12, 64), nn.ReLU(), nn.Linear(64, 3))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
criterion = nn.CrossEntropyLoss()

global_step = 0
for epoch in range(50):
    for batch_idx, (xb, yb) in enumerate(train):
        loss = criterion(model(xb), yb) / ACCUM_STEPS
        loss.backward()
        global_step += 1
        if (batch_idx + 1) % ACCUM_STEPS == 0:
            optimizer.step()
            optimizer.zero_grad()

with torch.no_grad():
    acc = (model(Xv).argmax(1) == yv).float().mean().item()
print("RESULT " + json.dumps({"val_accuracy": acc, "optimizer_steps": global_step // ACCUM_STEPS}))
