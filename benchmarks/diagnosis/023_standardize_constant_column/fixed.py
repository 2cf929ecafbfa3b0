import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def load_data(n=600, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g) * torch.tensor([10.0, 0.1, 3.0, 1.0]) + 5.0
    x = torch.cat([x, torch.full((n, 1), 7.0)], dim=1)  # a sensor that is stuck at 7.0
    y = (x[:, 0] / 10 - x[:, 2] / 3 + 0.2 * torch.randn(n, generator=g) > 0).float()
    return x, y


def standardize(x, eps=1e-6):
    mean = x.mean(dim=0, keepdim=True)
    std = x.std(dim=0, keepdim=True)
    return (x - mean) / (std + eps)


def main():
    torch.manual_seed(0)
    x, y = load_data()
    x = standardize(x)
    model = nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(200):
        idx = torch.randint(0, len(x), (32,))
        loss = F.binary_cross_entropy_with_logits(model(x[idx]).squeeze(1), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    with torch.no_grad():
        final = F.binary_cross_entropy_with_logits(model(x).squeeze(1), y).item()
    finite = math.isfinite(final)
    print("RESULT " + json.dumps({"loss_finite": finite, "final_loss": round(final, 4) if finite else 1e6}))


if __name__ == "__main__":
    main()
