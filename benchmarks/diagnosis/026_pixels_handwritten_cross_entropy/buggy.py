import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_digits(n, seed=0):
    """8x8 grey-level 'digits' with raw pixel values 0..255: a bright row, column or diagonal."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    x = torch.randint(0, 60, (n, 8, 8), generator=g).float()
    k = torch.randint(0, 8, (n,), generator=g)
    for i in range(n):
        if y[i] == 0:
            x[i, k[i], :] = 255.0
        elif y[i] == 1:
            x[i, :, k[i]] = 255.0
        else:
            x[i] += 195.0 * torch.eye(8)
    return x.flatten(1), y


def cross_entropy(logits, target, n_classes=3):
    onehot = F.one_hot(target, n_classes).float()
    return -(onehot * torch.log(F.softmax(logits, dim=1))).sum(dim=1).mean()


torch.manual_seed(0)
x, y = make_digits(600)
model = nn.Linear(64, 3)  # multinomial logistic regression on the pixels
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

for step in range(150):
    idx = torch.randint(0, len(x), (32,))
    logits = model(x[idx])
    loss = cross_entropy(logits, y[idx])
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if step % 50 == 0:
        print(f"step {step} loss {loss.item():.4f} max |logit| {logits.abs().max().item():.1f}")

with torch.no_grad():
    final = cross_entropy(model(x), y).item()
finite = math.isfinite(final)
print("RESULT " + json.dumps({"loss_finite": finite, "final_loss": round(final, 4) if finite else 1e6}))
