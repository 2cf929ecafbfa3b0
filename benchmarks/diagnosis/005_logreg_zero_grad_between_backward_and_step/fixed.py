import json

import torch
import torch.nn as nn


def make_data(n, dim=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    w_true = torch.randn(dim, generator=g)
    x = torch.randn(n, dim, generator=g)
    y = (x @ w_true + 0.3 * torch.randn(n, generator=g) > 0).float()
    return x, y


def main():
    torch.manual_seed(0)
    x_train, y_train = make_data(800)
    x_test, y_test = x_train[600:], y_train[600:]
    x_train, y_train = x_train[:600], y_train[:600]

    model = nn.Linear(10, 1)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    loss_fn = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)

    batch = 50
    for epoch in range(10):
        for start in range(0, len(x_train), batch):
            xb = x_train[start:start + batch]
            yb = y_train[start:start + batch]
            optimizer.zero_grad()
            loss = loss_fn(model(xb).squeeze(1), yb)
            loss.backward()
            optimizer.step()
        print(f"epoch {epoch} loss {loss.item():.4f}")

    with torch.no_grad():
        acc = ((model(x_test).squeeze(1) > 0).float() == y_test).float().mean().item()
        final_loss = loss_fn(model(x_train).squeeze(1), y_train).item()
    print("RESULT " + json.dumps({"test_accuracy": round(acc, 4), "final_loss": round(final_loss, 4)}))


if __name__ == "__main__":
    main()
