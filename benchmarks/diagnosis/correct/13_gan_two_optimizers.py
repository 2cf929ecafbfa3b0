"""A 1-D GAN: generator and discriminator each own their parameters and optimizer; detach() for the D step."""
import json

import torch
import torch.nn as nn
import torch.nn.functional as F


def main():
    torch.manual_seed(0)
    G = nn.Sequential(nn.Linear(4, 32), nn.ReLU(), nn.Linear(32, 1))
    D = nn.Sequential(nn.Linear(1, 32), nn.LeakyReLU(0.2), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(G.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(D.parameters(), lr=2e-3, betas=(0.5, 0.999))
    real_mean, real_std = 3.0, 0.5
    for step in range(300):
        real = real_mean + real_std * torch.randn(64, 1)
        fake = G(torch.randn(64, 4))
        # discriminator step (generator output detached)
        opt_d.zero_grad()
        d_loss = F.binary_cross_entropy_with_logits(D(real), torch.ones(64, 1)) + \
            F.binary_cross_entropy_with_logits(D(fake.detach()), torch.zeros(64, 1))
        d_loss.backward()
        opt_d.step()
        # generator step
        opt_g.zero_grad()
        g_loss = F.binary_cross_entropy_with_logits(D(fake), torch.ones(64, 1))
        g_loss.backward()
        opt_g.step()
        if step % 100 == 0:
            print(f"step {step} d_loss {d_loss.item():.3f} g_loss {g_loss.item():.3f}")
    with torch.no_grad():
        samples = G(torch.randn(2000, 4))
    print("RESULT " + json.dumps({"fake_mean": round(samples.mean().item(), 3), "fake_std": round(samples.std().item(), 3),
                                  "real_mean": real_mean}))


if __name__ == "__main__":
    main()
