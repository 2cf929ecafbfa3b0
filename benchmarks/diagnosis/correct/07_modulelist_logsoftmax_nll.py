"""nn.ModuleList of residual blocks; LogSoftmax output with nn.NLLLoss (the correct pairing)."""
import json

import torch
import torch.nn as nn

torch.manual_seed(0)


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x + torch.relu(self.lin(self.norm(x)))


class ResNetMLP(nn.Module):
    def __init__(self, d_in=2, d=48, depth=4, n_classes=4):
        super().__init__()
        self.inp = nn.Linear(d_in, d)
        self.blocks = nn.ModuleList(Block(d) for _ in range(depth))
        self.out = nn.Linear(d, n_classes)
        self.log_softmax = nn.LogSoftmax(dim=1)

    def forward(self, x):
        h = self.inp(x)
        for blk in self.blocks:
            h = blk(h)
        return self.log_softmax(self.out(h))


x = torch.rand(2000, 2) * 2 - 1
y = ((x[:, 0] > 0).long() * 2 + (x[:, 1] > 0).long())  # quadrant
model = ResNetMLP()
criterion = nn.NLLLoss()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(200):
    idx = torch.randint(0, len(x), (128,))
    optimizer.zero_grad()
    loss = criterion(model(x[idx]), y[idx])
    loss.backward()
    optimizer.step()
with torch.no_grad():
    out = model(x)
print("RESULT " + json.dumps({"final_loss": round(criterion(out, y).item(), 4),
                              "train_accuracy": round((out.argmax(1) == y).float().mean().item(), 4),
                              "n_parameters": sum(p.numel() for p in model.parameters())}))
