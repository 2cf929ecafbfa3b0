import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class DeepMLP(nn.Module):
    def __init__(self, d_in=2, width=32, depth=20, activation=nn.ReLU):
        super().__init__()
        layers = [nn.Linear(d_in, width), activation()]
        for _ in range(depth - 2):
            layers += [nn.Linear(width, width), activation()]
        layers.append(nn.Linear(width, 2))
        self.net = nn.Sequential(*layers)
        for m in self.net:            # He init for ReLU (chapter 3): PyTorch's default init also vanishes at depth 20
            if isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
                nn.init.zeros_(m.bias)

    def forward(self, x):
        return self.net(x)


torch.manual_seed(0)
n = 1024
x = torch.randn(n, 2)
y = (x.pow(2).sum(1) < 1.4).long()  # inside / outside a circle

model = DeepMLP()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
for step in range(250):
    idx = torch.randint(0, n, (128,))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x[idx]), y[idx])
    loss.backward()
    if step == 0:
        first = model.net[0].weight.grad.norm().item()
        last = model.net[-1].weight.grad.norm().item()
        print(f"grad norm first layer {first:.3g}, last layer {last:.3g}")
    optimizer.step()

with torch.no_grad():
    logits = model(x)
ratio = first / last
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, y).item(), 4),
                              "train_accuracy": round((logits.argmax(1) == y).float().mean().item(), 4),
                              "log10_first_to_last_grad_ratio": round(math.log10(ratio), 3) if ratio > 0 else -99.0}))
