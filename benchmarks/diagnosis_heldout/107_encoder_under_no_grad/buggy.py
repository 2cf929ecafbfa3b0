import json
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class AutoEncoder(nn.Module):
    def __init__(self, d=20, z=4):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(d, 32), nn.ReLU(), nn.Linear(32, z))
        self.decoder = nn.Sequential(nn.Linear(z, 32), nn.ReLU(), nn.Linear(32, d))

    def forward(self, x):
        with torch.no_grad():
            z = self.encoder(x)
        return self.decoder(z)


def main():
    torch.manual_seed(0)
    latent = torch.randn(512, 4)
    mix = torch.randn(4, 20)
    X = torch.tanh(latent @ mix) + 0.05 * torch.randn(512, 20)
    loader = DataLoader(TensorDataset(X), batch_size=64, shuffle=True)
    model = AutoEncoder()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    for epoch in range(20):
        for (xb,) in loader:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(xb), xb)
            loss.backward()
            opt.step()
    with torch.no_grad():
        recon = nn.functional.mse_loss(model(X), X).item()
    print("RESULT " + json.dumps({"recon_loss": recon}))


if __name__ == "__main__":
    main()
