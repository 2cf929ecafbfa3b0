"""torchrun-style DDP script: DistributedSampler with set_epoch, full checkpoint (model+optimizer+scheduler) and resume (correct)."""
import json
import os
import tempfile
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build():
    model = DDP(nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 2)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
    return model, opt, sched


def run_epochs(model, opt, sched, sampler, loader, start, stop):
    for epoch in range(start, stop):
        sampler.set_epoch(epoch)
        model.train()
        for xb, yb in loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
        sched.step()
    return loss.item()


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    X = torch.randn(256, 8)
    y = (X[:, 0] * X[:, 1] > 0).long()
    ds = TensorDataset(X, y)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=32, sampler=sampler)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "ckpt.pt")
        model, opt, sched = build()
        run_epochs(model, opt, sched, sampler, loader, 0, 3)
        if dist.get_rank() == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": opt.state_dict(),
                        "scheduler": sched.state_dict(), "epoch": 3}, path)
        dist.barrier()
        model, opt, sched = build()
        ckpt = torch.load(path)
        model.module.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        loss = run_epochs(model, opt, sched, sampler, loader, ckpt["epoch"], 10)
    model.eval()
    with torch.no_grad():
        acc = (model(X).argmax(1) == y).float().mean().item()
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"accuracy": acc, "final_loss": loss}))


if __name__ == "__main__":
    main()
