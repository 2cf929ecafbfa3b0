import json
import torch
import torch.nn as nn
import torch.nn.functional as F


class SeqClassifier(nn.Module):
    def __init__(self, vocab=12, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(torch.zeros(1, 8, d))
        self.enc = nn.TransformerEncoderLayer(d, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.cls = nn.Linear(d, 2)

    def forward(self, tokens):
        h = self.enc(self.emb(tokens) + self.pos)
        return self.cls(h.mean(1))


def batch(n):
    tokens = torch.randint(1, 12, (n, 8))
    y = (tokens == 3).any(1).long()  # does token 3 occur?
    return tokens, y


torch.manual_seed(0)
model = SeqClassifier()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=150)
for step in range(150):
    tokens, y = batch(64)
    optimizer.zero_grad()
    loss = F.cross_entropy(model(tokens), y)
    loss.backward()
    optimizer.step()
    scheduler.step()

model.eval()
with torch.no_grad():
    tokens, y = batch(1000)
    acc = (model(tokens).argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "final_loss": loss.item()}))
