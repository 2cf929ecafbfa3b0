"""Tiny GRU language model with tied input/output embeddings and torch.utils.checkpoint on the MLP block (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


class TinyLM(nn.Module):
    def __init__(self, vocab=16, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.rnn = nn.GRU(d, d, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 64), nn.GELU(), nn.Linear(64, d))
        self.out = nn.Linear(d, vocab, bias=False)
        self.out.weight = self.emb.weight  # shared parameter

    def forward(self, tokens):
        h, _ = self.rnn(self.emb(tokens))
        h = h + checkpoint(self.mlp, h, use_reentrant=False)
        return self.out(h)


torch.manual_seed(0)
# sequences that count up modulo 16 from a random start
starts = torch.randint(0, 16, (256, 1))
data = (starts + torch.arange(12)) % 16
model = TinyLM()
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
assert sum(1 for _ in model.parameters()) == len(list(model.parameters()))
for step in range(80):
    idx = torch.randint(0, 256, (32,))
    seq = data[idx]
    logits = model(seq[:, :-1])
    loss = F.cross_entropy(logits.reshape(-1, 16), seq[:, 1:].reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
with torch.no_grad():
    acc = (model(data[:, :-1]).argmax(-1) == data[:, 1:]).float().mean().item()
print("RESULT " + json.dumps({"next_token_accuracy": acc, "final_loss": loss.item()}))
