import json

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 60


def make_docs(n, seed=0):
    """Variable-length 'documents'; label 1 if any positive-sentiment token (1..5) outnumbers negative ones (6..10)."""
    g = torch.Generator().manual_seed(seed)
    tokens, offsets, labels = [], [], []
    pos = 0
    for _ in range(n):
        length = int(torch.randint(4, 16, (1,), generator=g))
        doc = torch.randint(11, VOCAB, (length,), generator=g)
        label = int(torch.randint(0, 2, (1,), generator=g))
        k = int(torch.randint(1, 4, (1,), generator=g))
        where = torch.randperm(length, generator=g)[:k]
        doc[where] = torch.randint(1, 6, (k,), generator=g) + (0 if label else 5)
        tokens.append(doc)
        offsets.append(pos)
        pos += length
        labels.append(label)
    return torch.cat(tokens), torch.tensor(offsets), torch.tensor(labels)


class BagClassifier(nn.Module):
    def __init__(self, dim=4):
        super().__init__()
        self.embedding = nn.EmbeddingBag(VOCAB, dim, mode="mean")
        self.classifier = nn.Sequential(nn.Linear(dim, 16), nn.ReLU(), nn.Linear(16, 2))

    def forward(self, tokens, offsets):
        emb = self.embedding(tokens, offsets)
        return self.classifier(emb)


torch.manual_seed(0)
tokens, offsets, labels = make_docs(600)
model = BagClassifier()
optimizer = torch.optim.Adam(model.parameters(), lr=2e-2)
for epoch in range(60):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(tokens, offsets), labels)
    loss.backward()
    optimizer.step()
    if epoch % 20 == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")

with torch.no_grad():
    logits = model(tokens, offsets)
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, labels).item(), 4),
                              "train_accuracy": round((logits.argmax(1) == labels).float().mean().item(), 4)}))
