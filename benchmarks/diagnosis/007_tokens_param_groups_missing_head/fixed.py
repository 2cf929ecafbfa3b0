import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ, N_CLASSES = 40, 12, 4


def make_sequences(n, seed):
    """Token sequences; the label is the index of the 'keyword' (tokens 1..4) that occurs most."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(5, VOCAB, (n, SEQ), generator=g)
    labels = torch.randint(0, N_CLASSES, (n,), generator=g)
    for i in range(n):
        pos = torch.randperm(SEQ, generator=g)[:3]
        tokens[i, pos] = labels[i] + 1
    return tokens, labels


class TinyAttentionClassifier(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.backbone = nn.ModuleDict({
            "embed": nn.Embedding(VOCAB, d),
            "attn": nn.MultiheadAttention(d, num_heads=2, batch_first=True),
            "norm": nn.LayerNorm(d),
        })
        self.head = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.Linear(d, N_CLASSES))

    def forward(self, tokens):
        h = self.backbone["embed"](tokens)
        a, _ = self.backbone["attn"](h, h, h, need_weights=False)
        h = self.backbone["norm"](h + a)
        return self.head(h.mean(dim=1))


torch.manual_seed(0)
train_x, train_y = make_sequences(1024, seed=1)
model = TinyAttentionClassifier()
optimizer = torch.optim.AdamW([
    {"params": model.backbone.parameters(), "lr": 3e-3},
    {"params": model.head.parameters(), "lr": 3e-3},
], weight_decay=0.01)

for step in range(150):
    idx = torch.randint(0, len(train_x), (64,))
    loss = F.cross_entropy(model(train_x[idx]), train_y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(f"step {step} loss {loss.item():.3f}")

with torch.no_grad():
    logits = model(train_x)
    final_loss = F.cross_entropy(logits, train_y).item()
    acc = (logits.argmax(1) == train_y).float().mean().item()
print("RESULT " + json.dumps({"final_loss": round(final_loss, 4), "train_accuracy": round(acc, 4)}))
