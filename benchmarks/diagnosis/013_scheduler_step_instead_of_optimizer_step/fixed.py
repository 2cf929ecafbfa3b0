import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class LSTMForecaster(nn.Module):
    def __init__(self, hidden=24):
        super().__init__()
        self.lstm = nn.LSTM(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 1)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.out(out[:, -1])


def make_series(n_windows=400, window=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n_windows + window + 1).float()
    series = torch.sin(0.2 * t) + 0.5 * torch.sin(0.05 * t) + 0.05 * torch.randn(len(t), generator=g)
    xs = torch.stack([series[i:i + window] for i in range(n_windows)]).unsqueeze(-1)
    ys = torch.stack([series[i + window] for i in range(n_windows)]).unsqueeze(-1)
    return xs, ys


def main():
    torch.manual_seed(0)
    xs, ys = make_series()
    loader = DataLoader(TensorDataset(xs, ys), batch_size=32, shuffle=True)
    model = LSTMForecaster()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=6 * len(loader))
    for epoch in range(6):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
        print(f"epoch {epoch} mse {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.5f}")
    with torch.no_grad():
        final = F.mse_loss(model(xs), ys).item()
    print("RESULT " + json.dumps({"final_loss": round(final, 5)}))


if __name__ == "__main__":
    main()
