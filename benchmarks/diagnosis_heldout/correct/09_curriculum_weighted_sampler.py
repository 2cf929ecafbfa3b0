"""Curriculum: stages of increasing difficulty; each stage drawn by a class-balanced WeightedRandomSampler (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Subset, TensorDataset, WeightedRandomSampler

torch.manual_seed(0)
N = 800
y = (torch.rand(N) < 0.2).long()            # imbalanced: 20% positives
margin = torch.rand(N) * 2                  # distance from the boundary = easiness
X = torch.randn(N, 6)
X[:, 0] = (2 * y - 1) * margin + 0.1 * torch.randn(N)
difficulty_order = torch.argsort(-margin)   # easiest first
ds = TensorDataset(X, y)
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2))
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
for stage, frac in enumerate([0.3, 0.6, 1.0]):
    idx = difficulty_order[: int(frac * N)]
    labels = y[idx]
    counts = torch.bincount(labels, minlength=2).float()
    weights = (1.0 / counts)[labels]
    sampler = WeightedRandomSampler(weights, num_samples=len(idx), replacement=True,
                                    generator=torch.Generator().manual_seed(stage))
    loader = DataLoader(Subset(ds, idx.tolist()), batch_size=32, sampler=sampler)
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
with torch.no_grad():
    pred = model(X).argmax(1)
    recall_pos = (pred[y == 1] == 1).float().mean().item()
    acc = (pred == y).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "positive_recall": recall_pos}))
