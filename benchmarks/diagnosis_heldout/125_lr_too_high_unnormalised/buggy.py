import json
import math
import torch
import torch.nn as nn

torch.manual_seed(0)
N = 512
X = torch.randn(N, 6) * torch.tensor([10.0, 8.0, 1.0, 12.0, 3.0, 6.0])
y = (X @ torch.tensor([0.3, -0.2, 1.0, 0.1, 0.5, -0.4])).unsqueeze(1) + 0.1 * torch.randn(N, 1)

model = nn.Linear(6, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.009)
loss_fn = nn.MSELoss()
for step in range(40):
    idx = torch.randint(0, N, (64,))
    opt.zero_grad()
    loss = loss_fn(model(X[idx]), y[idx])
    loss.backward()
    opt.step()
    if step % 10 == 0:
        print(step, f"{loss.item():.3e}")

with torch.no_grad():
    final = loss_fn(model(X), y).item()
finite = math.isfinite(final)
print("RESULT " + json.dumps({"log10_final_loss": math.log10(final) if finite else 40.0, "finite": finite}))
