import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SensorDataset(Dataset):
    """Predict a reading from 5 neighbouring sensors; targets are stored as (1,) rows."""

    def __init__(self, n=1200, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 5, generator=g)
        t = torch.sin(self.x[:, 0]) * 2 + self.x[:, 1] * self.x[:, 2] + 0.1 * torch.randn(n, generator=g)
        self.y = t.unsqueeze(1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(5, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 1))

    def forward(self, x):
        return self.net(x).squeeze(-1)


class Trainer:
    def __init__(self, model, lr=3e-3):
        self.model = model
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)

    def step(self, xb, yb):
        self.opt.zero_grad()
        loss = F.smooth_l1_loss(self.model(xb), yb)
        loss.backward()
        self.opt.step()
        return loss.item()


def main():
    torch.manual_seed(0)
    ds = SensorDataset()
    loader = DataLoader(ds, batch_size=64, shuffle=True)
    trainer = Trainer(Regressor())
    for epoch in range(10):
        losses = [trainer.step(xb, yb) for xb, yb in loader]
        print(f"epoch {epoch} loss {sum(losses) / len(losses):.4f}")
    with torch.no_grad():
        mae = (trainer.model(ds.x) - ds.y.squeeze(-1)).abs().mean().item()
    print("RESULT " + json.dumps({"eval_mae": round(mae, 4)}))


if __name__ == "__main__":
    main()
