import json
import random
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters


class Refiner(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.inp = nn.Linear(4, d)
        self.cell = nn.Sequential(nn.Linear(d, d), nn.Tanh())
        self.out = nn.Linear(d, 1)

    def forward(self, x, n_iters):
        h = self.inp(x)
        for _ in range(n_iters):
            h = h + 0.5 * self.cell(h)
        return self.out(h)


def main():
    random.seed(0)
    torch.manual_seed(0)
    X = torch.randn(256, 4)
    y = torch.sin(X.sum(1, keepdim=True))
    model = Refiner()
    model.cell = torch.compile(model.cell, backend="eager")  # compile the loop body, not the loop
    compiled = model
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for step in range(40):
        n_iters = random.randint(1, 8)  # random unroll depth, as a regulariser
        idx = torch.randint(0, 256, (32,))
        opt.zero_grad()
        loss = F.mse_loss(compiled(X[idx], n_iters), y[idx])
        loss.backward()
        opt.step()
    print("RESULT " + json.dumps({"final_loss": loss.item(), "unique_graphs": counters["stats"]["unique_graphs"]}))


if __name__ == "__main__":
    main()
