import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

PAD, VOCAB, MAXLEN = 0, 50, 10


class MaskedMeanPool(nn.Module):
    def forward(self, h, mask):
        summed = (h * mask.unsqueeze(-1)).sum(dim=1)
        count = mask.sum(dim=1, keepdim=True).clamp(min=1)
        return summed / count


class DocClassifier(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.proj = nn.Sequential(nn.Linear(dim, dim), nn.ReLU())
        self.pool = MaskedMeanPool()
        self.out = nn.Linear(dim, 2)

    def forward(self, tokens):
        mask = (tokens != PAD).float()
        return self.out(self.pool(self.proj(self.embed(tokens)), mask))


def make_batch(n, g):
    lengths = torch.randint(0, MAXLEN + 1, (n,), generator=g)  # some documents are empty
    tokens = torch.randint(1, VOCAB, (n, MAXLEN), generator=g)
    tokens[torch.arange(MAXLEN)[None, :] >= lengths[:, None]] = PAD
    labels = ((tokens > 25).sum(1) > (tokens.ne(PAD) & (tokens <= 25)).sum(1)).long()
    return tokens, labels


def main():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(0)
    model = DocClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=5e-3)
    for step in range(150):
        tokens, labels = make_batch(64, g)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens), labels)
        loss.backward()
        optimizer.step()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.4f}")
    tokens, labels = make_batch(512, g)
    with torch.no_grad():
        final = F.cross_entropy(model(tokens), labels).item()
    finite = math.isfinite(final)
    print("RESULT " + json.dumps({"loss_finite": finite, "final_loss": round(final, 4) if finite else 1e6}))


if __name__ == "__main__":
    main()
