"""Two correct binary set-ups side by side: raw logits + BCEWithLogitsLoss, and sigmoid + BCELoss."""
import json

import torch
import torch.nn as nn


def make_model():
    return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 1))


def train(model, loss_fn, x, y, use_sigmoid):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(150):
        optimizer.zero_grad()
        out = model(x).squeeze(1)
        if use_sigmoid:
            out = torch.sigmoid(out)
        loss = loss_fn(out, y)
        loss.backward()
        optimizer.step()
    return loss.item()


if __name__ == "__main__":
    torch.manual_seed(0)
    x = torch.randn(600, 5)
    y = ((x[:, 0] * x[:, 1] + x[:, 2]) > 0).float()
    torch.manual_seed(1)
    loss_logits = train(make_model(), nn.BCEWithLogitsLoss(), x, y, use_sigmoid=False)
    torch.manual_seed(1)
    loss_probs = train(make_model(), nn.BCELoss(), x, y, use_sigmoid=True)
    print("RESULT " + json.dumps({"bce_with_logits_final": round(loss_logits, 4), "sigmoid_bce_final": round(loss_probs, 4)}))
