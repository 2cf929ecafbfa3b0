import json
import math
import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return self.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class BagClassifier(nn.Module):
    def __init__(self, vocab=30, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=0)
        self.norm = RMSNorm(d)
        self.ff = nn.Sequential(nn.Linear(d, d), nn.ReLU())
        self.out = nn.Linear(d, 2)

    def forward(self, tokens):
        mask = (tokens != 0).unsqueeze(-1).float()
        h = self.ff(self.norm(self.emb(tokens)))
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1)
        return self.out(pooled)


def batch(n):
    lengths = torch.randint(3, 11, (n,))
    tokens = torch.randint(1, 30, (n, 10))
    tokens[torch.arange(10)[None, :] >= lengths[:, None]] = 0  # right padding
    y = ((tokens == 7) | (tokens == 8)).any(1).long()
    return tokens, y


torch.manual_seed(0)
model = BagClassifier()
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
for step in range(120):
    tokens, y = batch(64)
    opt.zero_grad()
    loss = F.cross_entropy(model(tokens), y)
    loss.backward()
    opt.step()

final = loss.item()
finite = math.isfinite(final)
print("RESULT " + json.dumps({"final_loss": final if finite else -1.0, "finite": finite}))
