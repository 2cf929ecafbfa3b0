"""A tiny language model with tied input/output embeddings and one block applied twice (shared weights)."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, D, CTX = 16, 32, 6


class TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, D)
        self.block = nn.Sequential(nn.Linear(D * CTX, D * CTX), nn.GELU())  # used twice
        self.proj = nn.Linear(D * CTX, D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight  # weight tying

    def forward(self, ctx):
        h = self.embed(ctx).flatten(1)
        h = h + self.block(h)
        h = h + self.block(h)
        return self.lm_head(self.proj(h))


torch.manual_seed(0)
# a deterministic sequence rule: next token = (a + b) % VOCAB of the last two tokens
seq = [1, 2]
for _ in range(3000):
    seq.append((seq[-1] + seq[-2]) % VOCAB)
data = torch.tensor(seq)
ctx = data.unfold(0, CTX, 1)[:-1]
target = data[CTX:]
model = TiedLM()
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(150):
    idx = torch.randint(0, len(ctx), (64,))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(ctx[idx]), target[idx])
    loss.backward()
    optimizer.step()
with torch.no_grad():
    logits = model(ctx)
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, target).item(), 4),
                              "accuracy": round((logits.argmax(1) == target).float().mean().item(), 4),
                              "tied": model.lm_head.weight is model.embed.weight}))
