import json
import torch
import torch.nn as nn


def target(t):
    return torch.sin(3 * t) + 0.5 * t


def main():
    torch.manual_seed(0)
    t = torch.linspace(-2, 2, 800).unsqueeze(1)  # a log recorded in time order
    y = target(t) + 0.05 * torch.randn_like(t)
    model = nn.Sequential(nn.Linear(1, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
    bs = 40
    for epoch in range(10):
        order = torch.arange(len(t))
        for i in range(0, len(t), bs):
            idx = order[i:i + bs]
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(t[idx]), y[idx])
            loss.backward()
            opt.step()
    tv = torch.rand(500, 1) * 4 - 2
    with torch.no_grad():
        val_mse = nn.functional.mse_loss(model(tv), target(tv)).item()
    print("RESULT " + json.dumps({"val_mse": val_mse}))


if __name__ == "__main__":
    main()
