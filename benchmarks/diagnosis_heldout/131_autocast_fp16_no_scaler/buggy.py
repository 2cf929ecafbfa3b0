import json
import torch
import torch.nn as nn
import torch.nn.functional as F

USE_SCALER = False

torch.manual_seed(0)
D = 1024
basis = torch.randn(16, D) / 4
def batch(n=128):
    return torch.randn(n, 16) @ basis * 0.002

model = nn.Sequential(nn.Linear(D, 64), nn.Linear(64, D))
opt = torch.optim.SGD(model.parameters(), lr=1.0)
scaler = torch.amp.GradScaler("cpu", enabled=USE_SCALER)
for step in range(60):
    x = batch()
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        recon = model(x)
    loss = F.mse_loss(recon.float(), x)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()

grads = torch.cat([p.grad.flatten() for p in model.parameters()])
zero_frac = (grads == 0).float().mean().item()
with torch.no_grad():
    x = batch(512)
    final = F.mse_loss(model(x), x).item()
print("RESULT " + json.dumps({"zero_grad_fraction": zero_frac, "final_loss": final}))
