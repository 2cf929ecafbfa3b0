"""Linear probe on a frozen, pretrained-style backbone whose BatchNorm is kept in eval mode on purpose (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F


class Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                                 nn.AdaptiveAvgPool2d(2), nn.Flatten())

    def forward(self, x):
        return self.net(x)


torch.manual_seed(0)
backbone = Backbone()
# "pretrained": give BatchNorm sensible statistics once, then freeze everything
with torch.no_grad():
    backbone.train()
    for _ in range(20):
        backbone(torch.randn(64, 1, 8, 8))
for p in backbone.parameters():
    p.requires_grad_(False)

head = nn.Sequential(nn.Dropout(0.2), nn.Linear(32, 2))
opt = torch.optim.Adam(head.parameters(), lr=1e-2)
X = torch.randn(400, 1, 8, 8)
y = (X[:, 0, :, :4].mean((1, 2)) > X[:, 0, :, 4:].mean((1, 2))).long()
for epoch in range(10):
    backbone.eval()   # frozen feature extractor: keep BN statistics fixed
    head.train()
    perm = torch.randperm(400)
    for i in range(0, 400, 40):
        idx = perm[i:i + 40]
        feats = backbone(X[idx])
        opt.zero_grad()
        loss = F.cross_entropy(head(feats), y[idx])
        loss.backward()
        opt.step()
head.eval()
with torch.no_grad():
    acc = (head(backbone(X)).argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "final_loss": loss.item()}))
