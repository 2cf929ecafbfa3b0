import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class LogisticModel(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.linear = nn.Linear(d, 1)

    def forward(self, x):
        return self.linear(x).squeeze(-1)


def bce_loss(z, y):
    p = torch.sigmoid(z)
    return -(y * torch.log(p) + (1 - y) * torch.log(1 - p)).mean()


def train(model, x, y, epochs=300, lr=0.5):
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    history = []
    for epoch in range(epochs):
        optimizer.zero_grad()
        loss = bce_loss(model(x), y)
        loss.backward()
        optimizer.step()
        history.append(loss.item())
    return history


if __name__ == "__main__":
    torch.manual_seed(0)
    # two well separated blobs
    x = torch.cat([torch.randn(200, 3) - 4.0, torch.randn(200, 3) + 4.0])
    y = torch.cat([torch.zeros(200), torch.ones(200)])
    model = LogisticModel(3)
    history = train(model, x, y)
    print("loss every 50 epochs:", [round(h, 4) for h in history[::50]])
    finite = all(math.isfinite(h) for h in history)
    print("RESULT " + json.dumps({"loss_finite": finite, "final_loss": round(history[-1], 6) if finite else 1e6}))
