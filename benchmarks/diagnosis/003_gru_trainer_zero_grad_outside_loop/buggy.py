import json
import math

import torch
import torch.nn as nn


def make_waves(n, length=24, seed=0):
    """Noisy sine waves; label 1 = high frequency, 0 = low frequency."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n,), generator=g)
    freq = torch.where(labels == 1, 0.9, 0.3) + 0.05 * torch.randn(n, generator=g)
    phase = torch.rand(n, generator=g) * 6.28
    t = torch.arange(length).float()
    x = torch.sin(freq[:, None] * t[None, :] + phase[:, None]) + 0.2 * torch.randn(n, length, generator=g)
    return x.unsqueeze(-1), labels


class GRUClassifier(nn.Module):
    def __init__(self, hidden=16):
        super().__init__()
        self.gru = nn.GRU(1, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x):
        _, h = self.gru(x)
        return self.head(h[-1])


class Trainer:
    def __init__(self, model, lr=0.05, batch_size=32):
        self.model = model
        self.batch_size = batch_size
        self.optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()

    def fit(self, x, y, steps):
        self.optimizer.zero_grad()
        for step in range(steps):
            idx = torch.randint(0, len(x), (self.batch_size,))
            loss = self.loss_fn(self.model(x[idx]), y[idx])
            loss.backward()
            self.optimizer.step()
            if step % 50 == 0:
                print(f"step {step}: loss {loss.item():.4f}")

    @torch.no_grad()
    def score(self, x, y):
        logits = self.model(x)
        return self.loss_fn(logits, y).item(), (logits.argmax(1) == y).float().mean().item()


if __name__ == "__main__":
    torch.manual_seed(0)
    x, y = make_waves(512)
    trainer = Trainer(GRUClassifier())
    trainer.fit(x, y, steps=200)
    loss, acc = trainer.score(x, y)
    finite = math.isfinite(loss)
    print("RESULT " + json.dumps({"final_loss": round(loss, 4) if finite else 1e6, "loss_finite": finite,
                                  "train_accuracy": round(acc, 4)}))
