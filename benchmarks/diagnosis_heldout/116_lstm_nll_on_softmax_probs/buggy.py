import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class LSTMNet(nn.Module):
    def __init__(self, n_classes=3):
        super().__init__()
        self.lstm = nn.LSTM(2, 24, batch_first=True)
        self.fc = nn.Linear(24, n_classes)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.fc(out[:, -1])


def make(n, gen):
    x = torch.randn(n, 12, 2, generator=gen)
    s = x[:, :, 0].sum(1) - x[:, :, 1].sum(1)
    y = torch.bucketize(s, torch.tensor([-2.0, 2.0]))
    return x, y


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    xtr, ytr = make(640, gen)
    xva, yva = make(400, gen)
    model = LSTMNet()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=64, shuffle=True)
    for epoch in range(8):
        for xb, yb in loader:
            logits = model(xb)
            loss = F.nll_loss(F.softmax(logits, dim=1), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
    with torch.no_grad():
        logits = model(xva)
        ce = F.cross_entropy(logits, yva).item()
        acc = (logits.argmax(1) == yva).float().mean().item()
    print("RESULT " + json.dumps({"val_cross_entropy": ce, "val_accuracy": acc}))


if __name__ == "__main__":
    main()
