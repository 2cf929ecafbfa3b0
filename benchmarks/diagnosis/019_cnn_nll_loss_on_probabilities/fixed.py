import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class TinyCNN(nn.Module):
    def __init__(self, n_classes=4):
        super().__init__()
        self.conv = nn.Conv2d(1, 12, 3, padding=1)
        self.fc = nn.Linear(12 * 4 * 4, n_classes)

    def forward(self, x):
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


def make_data(n, seed=0):
    """8x8 images with one of four textures: horizontal stripes, vertical stripes, checker, blank."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    i = torch.arange(8)
    patterns = torch.stack([
        (i[:, None] % 2).expand(8, 8).float(),
        (i[None, :] % 2).expand(8, 8).float(),
        ((i[:, None] + i[None, :]) % 2).float(),
        torch.zeros(8, 8),
    ])
    x = patterns[y].unsqueeze(1) + 1.0 * torch.randn(n, 1, 8, 8, generator=g)
    return x, y


def training_step(model, optimizer, xb, yb):
    optimizer.zero_grad()
    logits = model(xb)
    loss = F.nll_loss(F.log_softmax(logits, dim=1), yb)
    loss.backward()
    optimizer.step()
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    x, y = make_data(800)
    model = TinyCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(200):
        idx = torch.randint(0, len(x), (32,))
        loss = training_step(model, optimizer, x[idx], y[idx])
        if step % 50 == 0:
            print(f"step {step} loss {loss:.4f}")
    with torch.no_grad():
        logits = model(x)
    print("RESULT " + json.dumps({"eval_cross_entropy": round(F.cross_entropy(logits, y).item(), 4),
                                  "train_accuracy": round((logits.argmax(1) == y).float().mean().item(), 4)}))
