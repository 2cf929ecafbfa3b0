import json

import torch
import torch.nn as nn


class SeqClassifier(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.lstm = nn.LSTM(2, hidden, batch_first=True)
        self.fc = nn.Linear(hidden, 1)

    def forward(self, x):
        _, (h, _) = self.lstm(x)
        return torch.sigmoid(self.fc(h[-1]).squeeze(-1))


def make_data(n=600, length=10, seed=0):
    """Label 1 if the running sum of channel 0 ends above the sum of channel 1."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, length, 2, generator=g)
    y = (x[:, :, 0].sum(1) > x[:, :, 1].sum(1)).float()
    return x, y


def main():
    torch.manual_seed(0)
    x, y = make_data()
    model = SeqClassifier()
    criterion = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(150):
        idx = torch.randint(0, len(x), (64,))
        optimizer.zero_grad()
        loss = criterion(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    with torch.no_grad():
        out = model(x)
        final = criterion(out, y).item()
    print("RESULT " + json.dumps({"final_loss": round(final, 4)}))


if __name__ == "__main__":
    main()
