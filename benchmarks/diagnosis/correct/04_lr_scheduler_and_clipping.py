"""OneCycle LR schedule stepped per batch after optimizer.step(), with gradient-norm clipping."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class GRURegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.gru = nn.GRU(1, 32, batch_first=True)
        self.out = nn.Linear(32, 1)

    def forward(self, x):
        h, _ = self.gru(x)
        return self.out(h[:, -1])


def main():
    torch.manual_seed(0)
    t = torch.arange(600).float()
    series = torch.sin(0.1 * t) * torch.cos(0.03 * t)
    xs = torch.stack([series[i:i + 20] for i in range(560)]).unsqueeze(-1)
    ys = series[20:580].unsqueeze(-1)
    loader = DataLoader(TensorDataset(xs, ys), batch_size=32, shuffle=True)
    model = GRURegressor()
    epochs = 6
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=1e-2, total_steps=epochs * len(loader))
    max_norm_seen = 0.0
    for epoch in range(epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            max_norm_seen = max(max_norm_seen, norm.item())
            optimizer.step()
            scheduler.step()
        print(f"epoch {epoch} mse {loss.item():.5f} lr {scheduler.get_last_lr()[0]:.2e}")
    with torch.no_grad():
        final = F.mse_loss(model(xs), ys).item()
    print("RESULT " + json.dumps({"final_loss": round(final, 5), "max_grad_norm_before_clip": round(max_norm_seen, 4)}))


if __name__ == "__main__":
    main()
