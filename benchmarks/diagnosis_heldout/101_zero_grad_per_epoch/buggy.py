import json
import torch
import torch.nn as nn

torch.manual_seed(0)
N, D = 512, 8
X = torch.randn(N, D)
w_true = torch.randn(D, 1)
y = X @ w_true + 0.3 * torch.sin(3 * X[:, :1]) + 0.05 * torch.randn(N, 1)

model = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
loss_fn = nn.MSELoss()
batch_size = 32

for epoch in range(12):
    perm = torch.randperm(N)
    optimizer.zero_grad()
    running = 0.0
    for start in range(0, N, batch_size):
        idx = perm[start:start + batch_size]
        pred = model(X[idx])
        loss = loss_fn(pred, y[idx])
        loss.backward()
        optimizer.step()
        running += loss.item()
    print(f"epoch {epoch} loss {running / (N // batch_size):.4f}")

with torch.no_grad():
    final = loss_fn(model(X), y).item()
finite = bool(torch.isfinite(torch.tensor(final)))
print("RESULT " + json.dumps({"final_loss": final if finite else 1e9, "finite": finite}))
