import json
import os
import tempfile
import torch
import torch.nn as nn
import torch.nn.functional as F


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(2, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(16, 4))

    def forward(self, x):
        return self.net(x)


def make_data(n, gen, scale, shift):
    y = torch.randint(0, 4, (n,), generator=gen)
    x = torch.randn(n, 2, 8, 8, generator=gen)
    x[:, 0] += (y % 2).float().view(-1, 1, 1) * 1.5
    x[:, 1] += (y // 2).float().view(-1, 1, 1) * 1.5
    return x * scale + shift, y


class Trainer:
    def __init__(self, model, ckpt_path):
        self.model = model
        self.model.load_state_dict(torch.load(ckpt_path))
        self.model.train()
        self.opt = torch.optim.Adam(self.model.parameters(), lr=3e-3)

    def fit(self, x, y, epochs=6, bs=32):
        for epoch in range(epochs):
            perm = torch.randperm(len(x))
            for i in range(0, len(x), bs):
                idx = perm[i:i + bs]
                self.opt.zero_grad()
                loss = F.cross_entropy(self.model(x[idx]), y[idx])
                loss.backward()
                self.opt.step()
        return loss.item()

    @torch.no_grad()
    def validate(self, x, y):
        self.model.eval()
        return F.cross_entropy(self.model(x), y).item()


def main():
    torch.manual_seed(0)
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "init.pt")
        torch.save(SmallCNN().state_dict(), path)  # "pretrained" weights
        xtr, ytr = make_data(384, gen, scale=4.0, shift=3.0)  # new domain: different intensity
        xva, yva = make_data(256, gen, scale=4.0, shift=3.0)
        trainer = Trainer(SmallCNN(), path)
        train_loss = trainer.fit(xtr, ytr)
        val_loss = trainer.validate(xva, yva)
    # sanity check: do the first BatchNorm's running statistics describe the data it now sees?
    with torch.no_grad():
        conv_out = trainer.model.net[0](xva)
        actual_mean = conv_out.mean(dim=(0, 2, 3))
        gap = (trainer.model.net[1].running_mean - actual_mean).abs().max().item()
        bn_stats_match = gap < 0.25 * conv_out.std().item()
    print("RESULT " + json.dumps({"val_loss": val_loss, "train_loss": train_loss,
                                  "bn_running_mean_gap": gap, "bn_stats_match_data": bn_stats_match}))


if __name__ == "__main__":
    main()
