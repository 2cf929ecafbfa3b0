import json
import torch
import torch.nn as nn

torch.manual_seed(0)
C, D = 10, 20
centers = torch.randn(C, D) * 1.0
def sample(n):
    y = torch.randint(0, C, (n,))
    return centers[y] + torch.randn(n, D), y

model = nn.Sequential(
    nn.Linear(D, 64), nn.ReLU(),
    nn.Linear(64, C),
    nn.Softmax(dim=1),
)
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.SGD(model.parameters(), lr=0.03, momentum=0.5)

for step in range(150):
    x, y = sample(64)
    optimizer.zero_grad()
    loss = criterion(model(x), y)
    loss.backward()
    optimizer.step()

xv, yv = sample(2000)
with torch.no_grad():
    acc = (model(xv).argmax(1) == yv).float().mean().item()
print("RESULT " + json.dumps({"val_accuracy": acc, "final_loss": loss.item()}))
