"""Full-batch logistic regression with LBFGS and a closure (correct: step is called with the closure)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
X = torch.randn(400, 5)
y = (X @ torch.tensor([1.0, -2.0, 0.5, 0.0, 1.5]) + 0.3 * torch.randn(400) > 0).float()
model = nn.Linear(5, 1)
opt = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=20, line_search_fn="strong_wolfe")

def closure():
    opt.zero_grad()
    loss = F.binary_cross_entropy_with_logits(model(X).squeeze(1), y) + 1e-3 * model.weight.pow(2).sum()
    loss.backward()
    return loss

for outer in range(5):
    loss = opt.step(closure)
with torch.no_grad():
    acc = ((model(X).squeeze(1) > 0).float() == y).float().mean().item()
print("RESULT " + json.dumps({"final_loss": loss.item(), "accuracy": acc}))
