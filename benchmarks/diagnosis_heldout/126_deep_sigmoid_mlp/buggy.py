import json
import torch
import torch.nn as nn
import torch.nn.functional as F

ACT = nn.Sigmoid


def make_mlp(d_in, width, depth, d_out):
    layers = []
    for i in range(depth):
        lin = nn.Linear(d_in if i == 0 else width, width)
        if ACT is nn.ReLU:
            nn.init.kaiming_normal_(lin.weight, nonlinearity="relu")
        else:
            nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(lin.bias)
        layers += [lin, ACT()]
    layers.append(nn.Linear(width, d_out))
    return nn.Sequential(*layers)


torch.manual_seed(0)
X = torch.randn(512, 8)
y = ((X[:, 0] > 0) ^ (X[:, 1] > 0)).long()
model = make_mlp(8, 32, 12, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(200):
    idx = torch.randint(0, 512, (64,))
    opt.zero_grad()
    loss = F.cross_entropy(model(X[idx]), y[idx])
    loss.backward()
    opt.step()

with torch.no_grad():
    logits = model(X)
    final = F.cross_entropy(logits, y).item()
    acc = (logits.argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"final_loss": final, "accuracy": acc}))
