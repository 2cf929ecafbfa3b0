import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def make_bars(n, generator):
    """8x8 images with a horizontal (0), vertical (1) or diagonal (2) bar plus noise."""
    images = torch.randn(n, 1, 8, 8, generator=generator) * 0.3
    labels = torch.randint(0, 3, (n,), generator=generator)
    pos = torch.randint(1, 7, (n,), generator=generator)
    for i in range(n):
        p = int(pos[i])
        if labels[i] == 0:
            images[i, 0, p, :] += 1.0
        elif labels[i] == 1:
            images[i, 0, :, p] += 1.0
        else:
            images[i, 0] += torch.eye(8)
    return images, labels


class SmallCNN(nn.Module):
    def __init__(self, n_classes=3):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc = nn.Linear(16 * 2 * 2, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc(x.flatten(1))


def train_one_epoch(model, loader, optimizer):
    model.train()
    total = 0.0
    for images, labels in loader:
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(labels)
    return total / len(loader.dataset)


@torch.no_grad()
def evaluate(model, images, labels):
    model.eval()
    logits = model(images)
    return F.cross_entropy(logits, labels).item(), (logits.argmax(1) == labels).float().mean().item()


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    train_x, train_y = make_bars(600, g)
    test_x, test_y = make_bars(300, g)
    loader = DataLoader(TensorDataset(train_x, train_y), batch_size=32, shuffle=True)
    model = SmallCNN()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(5):
        train_loss = train_one_epoch(model, loader, optimizer)
        print(f"epoch {epoch} train_loss={train_loss:.4f}")
    test_loss, test_acc = evaluate(model, test_x, test_y)
    finite = math.isfinite(test_loss)
    print("RESULT " + json.dumps({"final_loss": round(test_loss, 4) if finite else 1e6, "loss_finite": finite,
                                  "test_accuracy": round(test_acc, 4)}))


if __name__ == "__main__":
    main()
