"""TransformerEncoderLayer trained under torch.autocast("cpu", dtype=torch.bfloat16), no scaler needed (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
emb = nn.Embedding(10, 16)
enc = nn.TransformerEncoderLayer(16, 2, dim_feedforward=32, dropout=0.1, batch_first=True)
head = nn.Linear(16, 2)
params = [*emb.parameters(), *enc.parameters(), *head.parameters()]
opt = torch.optim.AdamW(params, lr=3e-3)
def batch(n):
    t = torch.randint(0, 10, (n, 6))
    return t, (t[:, 0] > t[:, -1]).long()
for step in range(150):
    enc.train()
    tokens, y = batch(32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h = enc(emb(tokens))
        logits = head(h[:, 0] - h[:, -1])
    loss = F.cross_entropy(logits.float(), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
enc.eval()
with torch.no_grad():
    tokens, y = batch(500)
    h = enc(emb(tokens))
    acc = (head(h[:, 0] - h[:, -1]).argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "final_loss": loss.item()}))
