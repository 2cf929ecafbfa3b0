import json
import os
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

TOTAL_STEPS, SPLIT = 120, 60


def make_model():
    return nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 1))


def make_optimizer(model):
    return torch.optim.Adam(model.parameters(), lr=1e-2)


def batches(x, y):
    g = torch.Generator().manual_seed(123)
    for _ in range(TOTAL_STEPS):
        idx = torch.randint(0, len(x), (32,), generator=g)
        yield x[idx], y[idx]


def train_steps(model, optimizer, data, n):
    for _ in range(n):
        xb, yb = next(data)
        optimizer.zero_grad()
        loss = F.mse_loss(model(xb), yb)
        loss.backward()
        optimizer.step()
    return loss.item()


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def main():
    torch.manual_seed(0)
    x = torch.randn(512, 6)
    y = (x[:, :3].sum(1, keepdim=True) - x[:, 3:].prod(1, keepdim=True)).tanh()

    # reference: one uninterrupted run
    torch.manual_seed(1)
    ref = make_model()
    ref_opt = make_optimizer(ref)
    train_steps(ref, ref_opt, batches(x, y), TOTAL_STEPS)

    # same run, interrupted after SPLIT steps and resumed from a checkpoint
    torch.manual_seed(1)
    model = make_model()
    optimizer = make_optimizer(model)
    data = batches(x, y)
    train_steps(model, optimizer, data, SPLIT)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "checkpoint.pt")
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": SPLIT}, path)
        del model, optimizer

        checkpoint = torch.load(path)
        model = make_model()
        optimizer = make_optimizer(model)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
    loss = train_steps(model, optimizer, data, TOTAL_STEPS - checkpoint["step"])

    diff = (flat(model) - flat(ref)).abs().max().item()
    print(f"resumed run final loss {loss:.4f}")
    print("RESULT " + json.dumps({"max_abs_diff_vs_uninterrupted": round(diff, 6), "final_loss": round(loss, 4)}))


if __name__ == "__main__":
    main()
