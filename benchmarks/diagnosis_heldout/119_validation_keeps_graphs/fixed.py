import json
import torch
import torch.nn as nn
import torch.nn.functional as F


def validate(model, xv, yv, bs=128):
    model.eval()
    outs = []
    with torch.no_grad():
        for i in range(0, len(xv), bs):
            outs.append(model(xv[i:i + bs]))
    logits = torch.cat(outs)
    return logits, (logits.argmax(1) == yv).float().mean().item()


def main():
    torch.manual_seed(0)
    X = torch.randn(1024, 32)
    y = (X[:, :4].sum(1) > 0).long() + (X[:, 4] > 1).long()
    xtr, ytr, xv, yv = X[:768], y[:768], X[768:], y[768:]
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 3))
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    history = []
    for epoch in range(8):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 64):
            idx = perm[i:i + 64]
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
        val_logits, acc = validate(model, xv, yv)
        history.append(val_logits)
        print(f"epoch {epoch} val_acc {acc:.3f}")
    kept = sum(1 for t in history if t.grad_fn is not None)
    print("RESULT " + json.dumps({"val_accuracy": acc, "kept_graph_tensors": kept}))


if __name__ == "__main__":
    main()
