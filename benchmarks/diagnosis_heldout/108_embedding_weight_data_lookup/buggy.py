import json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
VOCAB, DIM, CLASSES = 200, 4, 5
token_label = torch.randint(0, CLASSES, (VOCAB,))


class TokenClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.mlp = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, CLASSES))

    def forward(self, tokens):
        vecs = self.emb.weight.data[tokens]
        return self.mlp(vecs)


model = TokenClassifier()
opt = torch.optim.Adam(model.parameters(), lr=0.02)
for step in range(300):
    tokens = torch.randint(0, VOCAB, (128,))
    opt.zero_grad()
    loss = F.cross_entropy(model(tokens), token_label[tokens])
    loss.backward()
    opt.step()

with torch.no_grad():
    all_tokens = torch.arange(VOCAB)
    acc = (model(all_tokens).argmax(1) == token_label).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "final_loss": loss.item()}))
