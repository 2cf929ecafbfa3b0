"""TD-style regression with a frozen target network updated by EMA under torch.no_grad() (correct)."""
import copy
import json
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
GAMMA, TAU = 0.9, 0.05
# tiny chain MDP: state i -> i+1, reward 1 at the last state
S = 8
onehot = torch.eye(S)
online = nn.Sequential(nn.Linear(S, 32), nn.ReLU(), nn.Linear(32, 1))
target = copy.deepcopy(online)
for p in target.parameters():
    p.requires_grad_(False)
opt = torch.optim.Adam(online.parameters(), lr=5e-3)
for step in range(300):
    s = torch.randint(0, S - 1, (32,))
    s_next = s + 1
    r = (s_next == S - 1).float().unsqueeze(1)
    done = r
    with torch.no_grad():
        td_target = r + GAMMA * (1 - done) * target(onehot[s_next])
    opt.zero_grad()
    loss = F.smooth_l1_loss(online(onehot[s]), td_target)
    loss.backward()
    opt.step()
    with torch.no_grad():
        for p_t, p_o in zip(target.parameters(), online.parameters()):
            p_t.mul_(1 - TAU).add_(p_o, alpha=TAU)
with torch.no_grad():
    v = online(onehot[:S - 1]).squeeze(1)
print("RESULT " + json.dumps({"v_first": v[0].item(), "v_last": v[-1].item(), "final_loss": loss.item()}))
