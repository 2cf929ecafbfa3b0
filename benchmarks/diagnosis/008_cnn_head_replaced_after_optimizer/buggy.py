import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self, n_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
        )
        self.fc = nn.Linear(16, n_classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


def make_blobs_images(n, seed=0):
    """8x8 images: a bright 3x3 square in one of four quadrants; the label is the quadrant."""
    g = torch.Generator().manual_seed(seed)
    x = 0.3 * torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 4, (n,), generator=g)
    for i in range(n):
        r, c = divmod(int(y[i]), 2)
        x[i, 0, r * 4:r * 4 + 3, c * 4:c * 4 + 3] += 1.5
    return x, y


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    torch.manual_seed(0)
    x, y = make_blobs_images(640)
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model.fc = nn.Linear(16, 4)  # our task has 4 classes

    for epoch in range(args.epochs):
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.3f}")

    with torch.no_grad():
        logits = model(x)
        final_loss = F.cross_entropy(logits, y).item()
        acc = (logits.argmax(1) == y).float().mean().item()
    print("RESULT " + json.dumps({"final_loss": round(final_loss, 4), "train_accuracy": round(acc, 4)}))


if __name__ == "__main__":
    main()
