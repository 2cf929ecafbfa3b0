import json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)


class Model(nn.Module):
    def __init__(self, n_classes):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU())
        self.fc = nn.Linear(32, n_classes)

    def forward(self, x):
        return self.fc(self.backbone(x))


centers = torch.randn(7, 16) * 2
def sample(n, classes):
    y = classes[torch.randint(0, len(classes), (n,))]
    return centers[y] + torch.randn(n, 16), y

# stage 1: pretrain on classes 0..3
model = Model(4)
opt = torch.optim.Adam(model.parameters(), lr=3e-3)
for step in range(100):
    x, y = sample(64, torch.arange(4))
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()

# stage 2: linear probe on classes 4..6 (relabelled 0..2), backbone frozen
for p in model.backbone.parameters():
    p.requires_grad_(False)
ft_opt = torch.optim.Adam(model.fc.parameters(), lr=3e-3)
model.fc = nn.Linear(32, 3)
for step in range(100):
    x, y = sample(64, torch.arange(4, 7))
    opt_target = y - 4
    ft_opt.zero_grad()
    loss = F.cross_entropy(model(x), opt_target)
    loss.backward()
    ft_opt.step()

with torch.no_grad():
    x, y = sample(600, torch.arange(4, 7))
    acc = (model(x).argmax(1) == y - 4).float().mean().item()
print("RESULT " + json.dumps({"finetune_accuracy": acc, "final_loss": loss.item()}))
