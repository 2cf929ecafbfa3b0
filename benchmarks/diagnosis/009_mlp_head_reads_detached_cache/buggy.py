import json

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Encoder(nn.Module):
    def __init__(self, d_in, d_hidden):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_hidden), nn.ReLU())

    def forward(self, x):
        return self.net(x)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Encoder(2, 32)
        self.head = nn.Linear(32, 2)
        self.cached = None

    def forward(self, x):
        h = self.encoder(x)
        self.cached = h.detach()  # kept for plotting the embedding later
        return self.head(self.cached)


# XOR-like: label = sign(x0) xor sign(x1)
x = torch.randn(2000, 2)
y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).long()

model = Model()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(300):
    idx = torch.randint(0, len(x), (128,))
    loss = F.cross_entropy(model(x[idx]), y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 100 == 0:
        print(f"step {step} loss {loss.item():.3f}")

with torch.no_grad():
    logits = model(x)
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, y).item(), 4),
                              "train_accuracy": round((logits.argmax(1) == y).float().mean().item(), 4)}))
