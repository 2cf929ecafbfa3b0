"""A tiny transformer encoder block (attention + dropout + LayerNorm) trained with AdamW and warmup-cosine
LambdaLR, validated each epoch with model.eval()/torch.no_grad() and switched back with model.train()."""
import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB, SEQ = 20, 10


class TinyEncoder(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d)
        self.pos = nn.Parameter(torch.zeros(SEQ, d))
        self.layer = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.cls = nn.Linear(d, 2)

    def forward(self, tokens):
        h = self.layer(self.embed(tokens) + self.pos)
        return self.cls(h.mean(1))


def make(n, seed):
    g = torch.Generator().manual_seed(seed)
    t = torch.randint(0, VOCAB, (n, SEQ), generator=g)
    return t, ((t == 0) | (t == 1)).any(1).long()  # does a 'keyword' token occur?


def main():
    torch.manual_seed(0)
    x, y = make(1024, 0)
    vx, vy = make(256, 1)
    model = TinyEncoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    total, warmup = 160, 16
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * s / total)))
    step = 0
    for epoch in range(4):
        model.train()
        for _ in range(total // 4):
            idx = torch.randint(0, len(x), (64,))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x[idx]), y[idx])
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
        model.eval()
        with torch.no_grad():
            acc = (model(vx).argmax(1) == vy).float().mean().item()
        print(f"epoch {epoch} loss {loss.item():.3f} val_acc {acc:.3f}")
    print("RESULT " + json.dumps({"val_accuracy": round(acc, 4), "steps": step}))


if __name__ == "__main__":
    main()
