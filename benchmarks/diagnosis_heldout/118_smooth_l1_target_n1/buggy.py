import json
import warnings
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

warnings.simplefilter("ignore")


class Signals(Dataset):
    """Noisy sine waves; the target is the frequency."""
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.freq = torch.rand(n, generator=g) * 3 + 1
        t = torch.linspace(0, 1, 32)
        self.x = torch.sin(2 * 3.14159 * self.freq[:, None] * t) + 0.1 * torch.randn(n, 32, generator=g)

    def __len__(self):
        return len(self.freq)

    def __getitem__(self, i):
        return self.x[i].unsqueeze(0), self.freq[i].reshape(1)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(1, 8, 5, padding=2), nn.ReLU(),
                                  nn.Conv1d(8, 8, 5, padding=2), nn.ReLU(), nn.Flatten())
        self.fc = nn.Linear(8 * 32, 1)

    def forward(self, x):
        return self.fc(self.conv(x)).squeeze(-1)


torch.manual_seed(0)
train = DataLoader(Signals(512, 1), batch_size=32, shuffle=True)
val = Signals(256, 2)
model = Regressor()
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for epoch in range(8):
    for xb, yb in train:
        opt.zero_grad()
        loss = F.smooth_l1_loss(model(xb), yb)
        loss.backward()
        opt.step()

with torch.no_grad():
    pred = model(val.x.unsqueeze(1))
    val_mae = (pred - val.freq).abs().mean().item()
print("RESULT " + json.dumps({"val_mae": val_mae, "train_loss": loss.item()}))
