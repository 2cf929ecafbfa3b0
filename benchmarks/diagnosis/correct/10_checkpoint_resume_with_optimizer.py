"""Train, checkpoint model + optimizer + scheduler to a temp dir, resume in a fresh model/optimizer, continue."""
import json
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

TOTAL, SPLIT = 100, 50


def build():
    model = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=30, gamma=0.5)
    return model, optimizer, scheduler


def run(model, optimizer, scheduler, x, y, steps, g):
    for _ in range(steps):
        idx = torch.randint(0, len(x), (32,), generator=g)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        scheduler.step()
    return loss.item()


def main():
    torch.manual_seed(0)
    x = torch.randn(400, 4)
    y = x[:, :1] * 2 - x[:, 1:2] ** 2

    torch.manual_seed(1)
    ref = build()
    run(*ref, x, y, TOTAL, torch.Generator().manual_seed(5))

    torch.manual_seed(1)
    model, optimizer, scheduler = build()
    g = torch.Generator().manual_seed(5)
    run(model, optimizer, scheduler, x, y, SPLIT, g)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": SPLIT}, path)
        ckpt = torch.load(path)
    model, optimizer, scheduler = build()
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    scheduler.load_state_dict(ckpt["scheduler"])
    loss = run(model, optimizer, scheduler, x, y, TOTAL - ckpt["step"], g)
    diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref[0].parameters()))
    print("RESULT " + json.dumps({"final_loss": round(loss, 4), "max_abs_diff_vs_uninterrupted": round(diff, 8)}))


if __name__ == "__main__":
    main()
