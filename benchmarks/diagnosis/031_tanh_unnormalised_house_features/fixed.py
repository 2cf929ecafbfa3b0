import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)

n = 1200
sqft = 500 + 2500 * torch.rand(n)
year = 1950 + 70 * torch.rand(n)
rooms = torch.randint(1, 8, (n,)).float()
distance_m = 100 + 5000 * torch.rand(n)
features = torch.stack([sqft, year, rooms, distance_m], dim=1)
# "expensive" label: a nonlinear function of the features
score = (sqft - 1750) / 700 + (year - 1985) / 20 - ((distance_m - 2600) / 1400) ** 2
labels = (score > 0).long()

mean, std = features.mean(0), features.std(0)
features = (features - mean) / std

loader = DataLoader(TensorDataset(features, labels), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 2))
optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

for epoch in range(8):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
    print(f"epoch {epoch} loss {loss.item():.4f}")

with torch.no_grad():
    h1 = torch.tanh(model[0](features))
    logits = model(features)
print("RESULT " + json.dumps({"final_loss": round(F.cross_entropy(logits, labels).item(), 4),
                              "train_accuracy": round((logits.argmax(1) == labels).float().mean().item(), 4),
                              "saturated_fraction_layer1": round((h1.abs() > 0.99).float().mean().item(), 4)}))
