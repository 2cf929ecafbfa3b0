"""Fine-tuning with a frozen backbone: requires_grad=False and only the head in the optimizer."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(10, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU())
        self.head = nn.Linear(64, 3)

    def forward(self, x):
        return self.head(self.backbone(x))


def main():
    torch.manual_seed(0)
    x = torch.randn(900, 10)
    y = (x[:, :3] * 2 + 0.3 * torch.randn(900, 3)).argmax(1)
    model = Net()
    # "pretrained" backbone: keep it fixed
    for p in model.backbone.parameters():
        p.requires_grad = False
    optimizer = torch.optim.Adam(model.head.parameters(), lr=1e-2)
    before = [p.clone() for p in model.backbone.parameters()]
    for step in range(200):
        idx = torch.randint(0, len(x), (64,))
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[idx]), y[idx])
        loss.backward()
        optimizer.step()
    unchanged = all(torch.equal(a, b) for a, b in zip(before, model.backbone.parameters()))
    with torch.no_grad():
        logits = model(x)
    print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, y).item(), 4),
                                  "train_accuracy": round((logits.argmax(1) == y).float().mean().item(), 4),
                                  "backbone_unchanged": unchanged}))


if __name__ == "__main__":
    main()
