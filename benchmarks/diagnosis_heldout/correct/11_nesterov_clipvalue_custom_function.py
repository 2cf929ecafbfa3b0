"""Custom autograd Function (straight-through clamp), SGD with nesterov, clip_grad_value_ (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F


class STEClamp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(-1, 1)

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out  # straight-through


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(8, 32)
        self.l2 = nn.Linear(32, 1)

    def forward(self, x):
        return self.l2(STEClamp.apply(self.l1(x)))


torch.manual_seed(0)
X = torch.randn(500, 8)
y = torch.tanh(X[:, :2].sum(1, keepdim=True)) + 0.05 * torch.randn(500, 1)
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
for step in range(200):
    idx = torch.randint(0, 500, (50,))
    opt.zero_grad()
    loss = F.mse_loss(model(X[idx]), y[idx])
    loss.backward()
    torch.nn.utils.clip_grad_value_(model.parameters(), 0.5)
    opt.step()
with torch.no_grad():
    final = F.mse_loss(model(X), y).item()
print("RESULT " + json.dumps({"final_loss": final}))
