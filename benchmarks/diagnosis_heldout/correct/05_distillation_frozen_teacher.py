"""Knowledge distillation: frozen teacher in eval/no_grad, KL on temperature-scaled log-probs (correct)."""
import json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
T = 3.0
C = 5
centers = torch.randn(C, 16) * 1.5
def sample(n):
    y = torch.randint(0, C, (n,))
    return centers[y] + torch.randn(n, 16), y

teacher = nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, C))
t_opt = torch.optim.Adam(teacher.parameters(), lr=3e-3)
for _ in range(100):
    x, y = sample(64)
    t_opt.zero_grad()
    F.cross_entropy(teacher(x), y).backward()
    t_opt.step()
teacher.eval()
for p in teacher.parameters():
    p.requires_grad_(False)

student = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, C))
opt = torch.optim.Adam(student.parameters(), lr=5e-3)
for _ in range(150):
    x, y = sample(64)
    with torch.no_grad():
        t_logits = teacher(x)
    s_logits = student(x)
    kd = F.kl_div(F.log_softmax(s_logits / T, dim=1), F.softmax(t_logits / T, dim=1), reduction="batchmean") * T * T
    loss = 0.5 * kd + 0.5 * F.cross_entropy(s_logits, y)
    opt.zero_grad()
    loss.backward()
    opt.step()
x, y = sample(1000)
with torch.no_grad():
    acc = (student(x).argmax(1) == y).float().mean().item()
print("RESULT " + json.dumps({"student_accuracy": acc, "final_loss": loss.item()}))
