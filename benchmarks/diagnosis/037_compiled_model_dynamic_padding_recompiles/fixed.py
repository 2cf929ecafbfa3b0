import json

import torch
import torch._dynamo.utils
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

MAXLEN, VOCAB, PAD = 24, 30, 0


class Sequences(Dataset):
    """Variable-length token sequences; label = whether token 7 occurs more often than token 8."""

    def __init__(self, n=512, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for _ in range(n):
            length = int(torch.randint(4, MAXLEN + 1, (1,), generator=g))
            seq = torch.randint(1, VOCAB, (length,), generator=g)
            self.items.append((seq, int((seq == 7).sum() > (seq == 8).sum())))

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def collate(batch):
    max_len = MAXLEN
    tokens = torch.full((len(batch), max_len), PAD, dtype=torch.long)
    for i, (seq, _) in enumerate(batch):
        tokens[i, :len(seq)] = seq
    return tokens, torch.tensor([label for _, label in batch])


class ConvTextClassifier(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim, padding_idx=PAD)
        self.conv = nn.Conv1d(dim, dim, 3, padding=1)
        self.out = nn.Linear(dim, 2)

    def forward(self, tokens):
        h = F.relu(self.conv(self.embed(tokens).transpose(1, 2)))
        mask = (tokens != PAD).unsqueeze(1)
        return self.out((h * mask).amax(dim=2))


def main():
    torch.manual_seed(0)
    loader = DataLoader(Sequences(), batch_size=16, shuffle=True, collate_fn=collate)
    model = ConvTextClassifier()
    compiled = torch.compile(model, backend="eager", dynamic=False)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for epoch in range(2):
        for tokens, labels in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(compiled(tokens), labels)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")
    stats = torch._dynamo.utils.counters["stats"]
    print("RESULT " + json.dumps({"unique_graphs": int(stats["unique_graphs"]), "final_loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
