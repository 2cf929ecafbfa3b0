import argparse
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.rand(1024, 4) * 4 - 2
    y = (5 * x[:, :1] ** 2 - 3 * x[:, 1:2] + x[:, 2:3] * x[:, 3:4] + 10)  # targets around 10..40

    model = nn.Sequential(nn.Linear(4, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    for step in range(args.steps):
        idx = torch.randint(0, len(x), (64,))
        optimizer.zero_grad()
        loss = F.mse_loss(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4g}")
    with torch.no_grad():
        final = F.mse_loss(model(x), y).item()
    finite = math.isfinite(final)
    print("RESULT " + json.dumps({"loss_finite": finite, "final_loss": round(final, 4) if finite else 1e6}))


if __name__ == "__main__":
    main()
