import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class ScaledTanhRegressor(nn.Module):
    """y = exp(log_scale) * tanh(body(x)): a bounded regressor with a learned amplitude."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(1, 32), nn.Tanh(), nn.Linear(32, 1))
        self.log_scale = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        scale = torch.tensor(self.log_scale.exp().item())
        return scale * torch.tanh(self.body(x))


def train(model, x, y, steps=300):
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
    for step in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.linspace(-2, 2, 256).unsqueeze(1)
    y = 4.0 * torch.sin(1.5 * x) + 0.1 * torch.randn_like(x)
    model = ScaledTanhRegressor()
    final = train(model, x, y)
    print(f"learned amplitude {model.log_scale.exp().item():.3f}")
    print("RESULT " + json.dumps({"final_loss": round(final, 4), "learned_scale": round(model.log_scale.exp().item(), 4)}))
