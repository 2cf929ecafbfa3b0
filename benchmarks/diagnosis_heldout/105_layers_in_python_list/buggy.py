import json
import torch
import torch.nn as nn


class MLP(nn.Module):
    def __init__(self, d_in, hidden, depth, d_out):
        super().__init__()
        dims = [d_in] + [hidden] * depth
        self.hidden = [nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:])]
        self.out = nn.Linear(hidden, d_out)

    def forward(self, x):
        for layer in self.hidden:
            x = torch.tanh(layer(x))
        return self.out(x)


torch.manual_seed(0)
X = torch.rand(400, 2) * 4 - 2
y = (torch.sin(2 * X[:, :1]) * torch.cos(2 * X[:, 1:]))
model = MLP(2, 32, 3, 1)
optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
print("parameters seen by the optimizer:", sum(p.numel() for g in optimizer.param_groups for p in g["params"]))

for step in range(250):
    idx = torch.randint(0, 400, (64,))
    optimizer.zero_grad()
    loss = nn.functional.mse_loss(model(X[idx]), y[idx])
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(step, round(loss.item(), 4))

with torch.no_grad():
    final = nn.functional.mse_loss(model(X), y).item()
print("RESULT " + json.dumps({"final_loss": final}))
