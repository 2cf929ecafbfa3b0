"""Frozen embedding passed to the optimizer anyway (requires_grad=False): it is skipped, which is fine."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 50


class BagModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.EmbeddingBag(VOCAB, 16, mode="mean")
        self.embedding.weight.requires_grad_(False)  # "pretrained" vectors, kept fixed
        self.mlp = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

    def forward(self, tokens):
        return self.mlp(self.embedding(tokens))


torch.manual_seed(0)
tokens = torch.randint(0, VOCAB, (800, 8))
labels = ((tokens < 10).sum(1) > (tokens >= 40).sum(1)).long()
model = BagModel()
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3, weight_decay=0.0)  # includes the frozen table
emb_before = model.embedding.weight.clone()
for epoch in range(80):
    optimizer.zero_grad()
    loss = F.cross_entropy(model(tokens), labels)
    loss.backward()
    optimizer.step()
    if epoch % 20 == 0:
        print(f"epoch {epoch} loss {loss.item():.4f}")
with torch.no_grad():
    logits = model(tokens)
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, labels).item(), 4),
                              "train_accuracy": round((logits.argmax(1) == labels).float().mean().item(), 4),
                              "embedding_unchanged": torch.equal(emb_before, model.embedding.weight)}))
