import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)

x = torch.linspace(-3, 3, 512).unsqueeze(1)
y = torch.sin(2 * x) + 0.1 * torch.randn_like(x)

model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for step in range(300):
    idx = torch.randint(0, len(x), (64,))
    pred = model(x[idx])
    loss = F.mse_loss(pred, y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step:3d} mse {loss.item():.4f}")

with torch.no_grad():
    final = F.mse_loss(model(x), y).item()
print("RESULT " + json.dumps({"final_loss": round(final, 5), "loss_finite": math.isfinite(final)}))
