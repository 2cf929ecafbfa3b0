"""optimizer.zero_grad(set_to_none=False) in one model, model.zero_grad() in another; evaluation under inference_mode."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


class Trainer:
    def __init__(self, model, clear):
        self.model = model
        self.clear = clear
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)

    def fit(self, x, y, steps=150):
        for _ in range(steps):
            idx = torch.randint(0, len(x), (32,))
            if self.clear == "optimizer":
                self.optimizer.zero_grad(set_to_none=False)
            else:
                self.model.zero_grad()
            loss = F.cross_entropy(self.model(x[idx]), y[idx])
            loss.backward()
            self.optimizer.step()

    def accuracy(self, x, y):
        self.model.eval()
        with torch.inference_mode():
            acc = (self.model(x).argmax(1) == y).float().mean().item()
        self.model.train()
        return acc


torch.manual_seed(0)
x = torch.randn(800, 6)
y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long()
results = {}
for clear in ("optimizer", "model"):
    torch.manual_seed(1)
    trainer = Trainer(nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2)), clear)
    trainer.fit(x, y)
    results[f"accuracy_{clear}_zero_grad"] = round(trainer.accuracy(x, y), 4)
print("RESULT " + json.dumps(results))
