import json
import torch
import torch.nn as nn


class GRUClassifier(nn.Module):
    def __init__(self, hidden=24):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.out = nn.Linear(hidden, 2)

    def forward(self, x):
        _, h = self.gru(x)
        return self.out(h[-1])


def train_one_epoch(model, optimizer, X, y, batch_size=32):
    perm = torch.randperm(len(X))
    total = 0.0
    for start in range(0, len(X), batch_size):
        idx = perm[start:start + batch_size]
        loss = nn.functional.cross_entropy(model(X[idx]), y[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item() * len(idx)
    return total / len(X)


def main():
    torch.manual_seed(0)
    X = torch.randn(320, 10, 1)
    y = (X.sum(dim=(1, 2)) > 0).long()  # is the running sum positive at the end?
    model = GRUClassifier()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for epoch in range(8):
        loss = train_one_epoch(model, optimizer, X, y)
        print(f"epoch {epoch} loss {loss:.4f}")
    with torch.no_grad():
        acc = (model(X).argmax(1) == y).float().mean().item()
    print("RESULT " + json.dumps({"accuracy": acc, "final_loss": loss}))


if __name__ == "__main__":
    main()
