import json
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
N, D = 600, 10
X = torch.randn(N, D)
w = torch.randn(D)
y = (X @ w + 0.2 * torch.randn(N) > 0).float()

model = nn.Linear(D, 1)
loss_fn = nn.BCEWithLogitsLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
loader = DataLoader(TensorDataset(X, y), batch_size=50, shuffle=True)

for epoch in range(6):
    for xb, yb in loader:
        optimizer.zero_grad()
        logits = model(xb).squeeze(1)
        loss = loss_fn(logits, yb)
        optimizer.step()
        loss.backward()
    print(f"epoch {epoch} last batch loss {loss.item():.4f}")

with torch.no_grad():
    logits = model(X).squeeze(1)
    final = loss_fn(logits, y).item()
    acc = ((logits > 0).float() == y).float().mean().item()
print("RESULT " + json.dumps({"final_loss": final, "accuracy": acc}))
