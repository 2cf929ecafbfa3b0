"""BatchNorm CNN toggling train()/eval() per epoch, validation under torch.inference_mode, detached loss history (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F


def make(n, gen):
    y = torch.randint(0, 2, (n,), generator=gen)
    x = torch.randn(n, 1, 10, 10, generator=gen)
    x[y == 1, :, 3:7, 3:7] += 0.8
    return x, y


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    xtr, ytr = make(320, gen)
    xva, yva = make(160, gen)
    model = nn.Sequential(nn.Conv2d(1, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                          nn.Flatten(), nn.Dropout(0.2), nn.Linear(8 * 16, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    history, val_hist = [], []
    for epoch in range(6):
        model.train()
        perm = torch.randperm(len(xtr))
        for i in range(0, len(xtr), 32):
            idx = perm[i:i + 32]
            opt.zero_grad()
            loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
            history.append(loss.detach())
        model.eval()
        with torch.inference_mode():
            logits = model(xva)
            val_hist.append(logits)
            acc = (logits.argmax(1) == yva).float().mean().item()
    mean_loss = torch.stack(history[-10:]).mean().item()
    print("RESULT " + json.dumps({"val_accuracy": acc, "recent_train_loss": mean_loss}))


if __name__ == "__main__":
    main()
