import json
import os
import tempfile
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(1024, 8)
y = torch.tanh(X @ torch.randn(8, 1)) + 0.3 * X[:, :1] * X[:, 1:2]


def build():
    model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    return model, torch.optim.Adam(model.parameters(), lr=3e-3)


def train(model, opt, steps, gen):
    losses = []
    for _ in range(steps):
        idx = torch.randint(0, len(X), (64,), generator=gen)
        opt.zero_grad()
        loss = F.mse_loss(model(X[idx]), y[idx])
        loss.backward()
        opt.step()
        with torch.no_grad():
            losses.append(F.mse_loss(model(X), y).item())
    return losses


with tempfile.TemporaryDirectory() as tmp:
    ckpt_path = os.path.join(tmp, "ckpt.pt")
    model, opt = build()
    before = train(model, opt, 250, torch.Generator().manual_seed(1))
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 250}, ckpt_path)

    # --- later: resume ---
    model, opt = build()
    ckpt = torch.load(ckpt_path)
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["optimizer"])
    after = train(model, opt, 30, torch.Generator().manual_seed(2))

jump = max(after[:10]) - before[-1]
print("RESULT " + json.dumps({"loss_before_save": before[-1], "loss_jump_after_resume": jump, "final_loss": after[-1]}))
