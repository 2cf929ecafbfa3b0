import json
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


def bce(logits, y):
    return F.binary_cross_entropy_with_logits(logits, y)


torch.manual_seed(0)
X = torch.randn(512, 6)
y = (X[:, 0] + X[:, 1] > 0).float()
X[:, 0] += 3 * (2 * y - 1)  # well separated classes
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.03)
for step in range(200):
    idx = torch.randint(0, 512, (64,))
    opt.zero_grad()
    loss = bce(model(X[idx]).squeeze(1), y[idx])
    loss.backward()
    opt.step()

final = loss.item()
finite = math.isfinite(final)
print("RESULT " + json.dumps({"final_loss": final if finite else -1.0, "finite": finite}))
