"""Mixed precision on CPU: torch.autocast(float16) with torch.amp.GradScaler and clip after unscale_ (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(512, 32)
y = (X[:, :8].sum(1) > 0).long()
model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
scaler = torch.amp.GradScaler("cpu")
for step in range(80):
    idx = torch.randint(0, 512, (64,))
    opt.zero_grad()
    with torch.autocast("cpu", dtype=torch.float16):
        logits = model(X[idx])
    loss = F.cross_entropy(logits.float(), y[idx])
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
with torch.no_grad():
    acc = (model(X).argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "final_loss": loss.item(), "scale": scaler.get_scale()}))
