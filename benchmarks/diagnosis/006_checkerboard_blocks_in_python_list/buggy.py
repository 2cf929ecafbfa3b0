import json

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


def checkerboard(n, cells=4):
    x = torch.rand(n, 2) * 2 - 1
    ix = ((x[:, 0] + 1) / 2 * cells).long().clamp(max=cells - 1)
    iy = ((x[:, 1] + 1) / 2 * cells).long().clamp(max=cells - 1)
    return x, ((ix + iy) % 2).long()


class ResidualMLP(nn.Module):
    def __init__(self, d_in=2, width=64, depth=3, n_out=2):
        super().__init__()
        self.inp = nn.Linear(d_in, width)
        self.blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(depth)]
        self.out = nn.Linear(width, n_out)

    def forward(self, x):
        h = F.relu(self.inp(x))
        for block in self.blocks:
            h = h + block(h)
        return self.out(h)


x, y = checkerboard(2048)
model = ResidualMLP()
print("trainable tensors:", len(list(model.parameters())))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

for step in range(400):
    idx = torch.randint(0, len(x), (128,))
    loss = F.cross_entropy(model(x[idx]), y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.3f}")

with torch.no_grad():
    logits = model(x)
    final_loss = F.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"final_loss": round(final_loss, 4), "train_accuracy": round(acc, 4)}))
