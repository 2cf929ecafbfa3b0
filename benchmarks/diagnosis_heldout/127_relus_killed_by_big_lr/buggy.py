import json
import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1 = nn.Linear(4, 64)
        self.l2 = nn.Linear(64, 64)
        self.l3 = nn.Linear(64, 2)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


torch.manual_seed(0)
X = torch.randn(600, 4)
y = ((X[:, 0] ** 2 + X[:, 1]) > 1).long()
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=3.0, momentum=0.9)
for step in range(150):
    idx = torch.randint(0, 600, (50,))
    opt.zero_grad()
    loss = F.cross_entropy(model(X[idx]), y[idx])
    loss.backward()
    opt.step()

with torch.no_grad():
    h2 = torch.relu(model.l2(torch.relu(model.l1(X))))
    dead = (h2.max(0).values <= 0).float().mean().item()
    logits = model(X)
    final = F.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"final_loss": final, "accuracy": acc, "dead_fraction_l2": dead}))
