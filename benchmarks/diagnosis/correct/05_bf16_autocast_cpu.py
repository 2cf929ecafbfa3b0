"""Mixed precision on CPU with bfloat16 autocast (no GradScaler needed for bfloat16)."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                      nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(16, 2)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


torch.manual_seed(0)
x = torch.randn(512, 1, 8, 8) * 0.5
y = torch.randint(0, 2, (512,))
x[y == 1, :, :4, :] += 1.0  # class 1: bright upper half
model = SmallCNN()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(120):
    idx = torch.randint(0, 512, (64,))
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(x[idx])
        loss = F.cross_entropy(logits, y[idx])
    loss.backward()
    optimizer.step()
    if step % 40 == 0:
        print(f"step {step} loss {loss.item():.4f} logits dtype {logits.dtype}")
with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
    logits = model(x)
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits.float(), y).item(), 4),
                              "train_accuracy": round((logits.argmax(1) == y).float().mean().item(), 4)}))
