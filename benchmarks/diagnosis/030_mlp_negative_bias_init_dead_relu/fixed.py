import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def init_weights(m):
    if isinstance(m, nn.Linear):
        nn.init.kaiming_uniform_(m.weight, nonlinearity="relu")
        nn.init.zeros_(m.bias)


def build_model():
    model = nn.Sequential(
        nn.Linear(10, 64), nn.ReLU(),
        nn.Linear(64, 64), nn.ReLU(),
        nn.Linear(64, 4),
    )
    model.apply(init_weights)
    return model


def train_one_epoch(model, loader, optimizer):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    X = torch.randn(1000, 10) * 0.3
    Y = (X[:, :4] + 0.1 * torch.randn(1000, 4)).argmax(1)
    loader = DataLoader(TensorDataset(X, Y), batch_size=50, shuffle=True)
    model = build_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(8):
        loss = train_one_epoch(model, loader, optimizer)
        print(f"epoch {epoch} loss {loss:.4f}")
    with torch.no_grad():
        h = model[1](model[0](X))
        logits = model(X)
    print("RESULT " + json.dumps({"train_accuracy": round((logits.argmax(1) == Y).float().mean().item(), 4),
                                  "dead_unit_fraction": round((h.amax(0) <= 0).float().mean().item(), 4)}))
