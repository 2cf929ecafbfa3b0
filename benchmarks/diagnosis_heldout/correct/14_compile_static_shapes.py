"""torch.compile(backend="eager") on a model fed fixed-size batches (drop_last=True): compiles once (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.utils.data import DataLoader, TensorDataset


class ConvNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(1, 8, 5, padding=2)
        self.fc = nn.Linear(8 * 24, 2)

    def forward(self, x):
        return self.fc(F.relu(self.conv(x)).flatten(1))


torch.manual_seed(0)
X = torch.randn(300, 1, 24)
y = (X[:, 0, 10:14].mean(1) > 0).long()
loader = DataLoader(TensorDataset(X, y), batch_size=32, shuffle=True, drop_last=True)
model = ConvNet()
compiled = torch.compile(model, backend="eager")
opt = torch.optim.Adam(model.parameters(), lr=5e-3)
for epoch in range(5):
    for xb, yb in loader:
        opt.zero_grad()
        loss = F.cross_entropy(compiled(xb), yb)
        loss.backward()
        opt.step()
with torch.no_grad():
    acc = (model(X).argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"accuracy": acc, "unique_graphs": counters["stats"]["unique_graphs"]}))
