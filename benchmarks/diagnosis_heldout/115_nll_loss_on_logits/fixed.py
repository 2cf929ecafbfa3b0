import argparse
import json
import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()

    torch.manual_seed(0)
    centers = torch.randn(4, 8)
    def sample(n):
        y = torch.randint(0, 4, (n,))
        return centers[y] + 0.9 * torch.randn(n, 8), y

    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 4))
    criterion = nn.NLLLoss()
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    for step in range(args.steps):
        x, y = sample(64)
        logits = model(x)
        loss = criterion(F.log_softmax(logits, dim=1), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    xv, yv = sample(2000)
    with torch.no_grad():
        logits = model(xv)
        ce = F.cross_entropy(logits, yv).item()
        acc = (logits.argmax(1) == yv).float().mean().item()
    print("RESULT " + json.dumps({"val_cross_entropy": ce, "val_accuracy": acc}))


if __name__ == "__main__":
    main()
