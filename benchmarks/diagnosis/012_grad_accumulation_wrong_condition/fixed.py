import json

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)

# linearly separable-ish 5-class problem in 8-D
W = torch.randn(8, 5)
X = torch.randn(1200, 8)
Y = (X @ W + 0.5 * torch.randn(1200, 5)).argmax(1)
loader = DataLoader(TensorDataset(X, Y), batch_size=16, shuffle=True)

model = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 5))
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
accum_steps = 4

for epoch in range(4):
    optimizer.zero_grad()
    for i, (xb, yb) in enumerate(loader):
        loss = criterion(model(xb), yb) / accum_steps
        loss.backward()
        if (i + 1) % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
    print(f"epoch {epoch} last micro-batch loss {loss.item() * accum_steps:.3f}")

with torch.no_grad():
    logits = model(X)
print("RESULT " + json.dumps({"final_loss": round(criterion(logits, Y).item(), 4),
                              "train_accuracy": round((logits.argmax(1) == Y).float().mean().item(), 4)}))
