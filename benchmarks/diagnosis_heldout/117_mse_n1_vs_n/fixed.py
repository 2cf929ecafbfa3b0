import json
import warnings
import torch
import torch.nn as nn

warnings.simplefilter("ignore")  # keep the log tidy
torch.manual_seed(0)
X = torch.randn(256, 5)
y = X[:, 0] * 2 - X[:, 1] + 0.5 * X[:, 2] ** 2 + 0.1 * torch.randn(256)
Xv = torch.randn(256, 5)
yv = Xv[:, 0] * 2 - Xv[:, 1] + 0.5 * Xv[:, 2] ** 2

model = nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 1))
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
loss_fn = nn.MSELoss()
for step in range(200):
    opt.zero_grad()
    pred = model(X).squeeze(1)
    loss = loss_fn(pred, y)
    loss.backward()
    opt.step()

with torch.no_grad():
    val_mse = ((model(Xv).squeeze(1) - yv) ** 2).mean().item()
print("RESULT " + json.dumps({"val_mse": val_mse, "train_loss": loss.item()}))
