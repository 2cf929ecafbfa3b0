import json
import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1 = nn.Conv2d(c, c, 3, padding=1)
        self.b1 = nn.BatchNorm2d(c)
        self.c2 = nn.Conv2d(c, c, 3, padding=1)
        self.b2 = nn.BatchNorm2d(c)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(1, 8, 3, padding=1)
        self.block = ResBlock(8)
        self.fc = nn.Linear(8, 2)

    def forward(self, x):
        return self.fc(self.block(self.stem(x)).mean(dim=(2, 3)))


def count_graph_nodes(values):
    seen, stack = set(), [v.grad_fn for v in values if torch.is_tensor(v) and v.grad_fn is not None]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(nxt for nxt, _ in fn.next_functions)
    return len(seen)


class Trainer:
    def __init__(self, model):
        self.model = model
        self.opt = torch.optim.Adam(model.parameters(), lr=3e-3)
        self.history = []

    def step(self, x, y):
        self.opt.zero_grad()
        loss = F.cross_entropy(self.model(x), y)
        loss.backward()
        self.opt.step()
        self.history.append(loss)


torch.manual_seed(0)
X = torch.randn(256, 1, 8, 8)
Y = (X[:, 0, :4].mean((1, 2)) > X[:, 0, 4:].mean((1, 2))).long()
trainer = Trainer(Net())
for step in range(60):
    idx = torch.randint(0, 256, (32,))
    trainer.step(X[idx], Y[idx])

last = float(trainer.history[-1])
print("RESULT " + json.dumps({"final_loss": last, "graph_nodes_kept": count_graph_nodes(trainer.history)}))
