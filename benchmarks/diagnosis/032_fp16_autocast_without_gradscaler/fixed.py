import json

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_model(width=64, depth=5):
    layers, d = [], 16
    for _ in range(depth):
        layers += [nn.Linear(d, width), nn.ReLU()]
        d = width
    layers.append(nn.Linear(d, 1))
    model = nn.Sequential(*layers)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, std=0.02)  # GPT-style small init
            nn.init.zeros_(m.bias)
    return model


def main():
    torch.manual_seed(0)
    # concentrations in mol/L: small targets, hence a small loss
    x = torch.randn(4096, 16)
    y = 0.01 * torch.tanh(x @ torch.randn(16, 1) / 4)

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu")
    zero_fracs = []
    for step in range(150):
        idx = torch.randint(0, len(x), (256,))
        optimizer.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x[idx]), y[idx])
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        zero_fracs.append((grads == 0).float().mean().item())
        scaler.step(optimizer)
        scaler.update()
        if step % 50 == 0:
            print(f"step {step} loss {loss.item():.3e} zero-grad fraction {zero_fracs[-1]:.3f}")

    with torch.no_grad():
        final = F.mse_loss(model(x), y).item()
    print("RESULT " + json.dumps({"zero_grad_fraction": round(sum(zero_fracs) / len(zero_fracs), 4),
                                  "final_loss_x1e6": round(final * 1e6, 3)}))


if __name__ == "__main__":
    main()
