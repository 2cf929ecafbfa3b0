import json
import os
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    X = torch.randn(320, 10)
    y = (X[:, 0] - X[:, 1] > 0).long()
    ds = TensorDataset(torch.arange(len(X)), X, y)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=32, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    orders = []
    for epoch in range(4):
        seen = []
        for idx, xb, yb in loader:
            seen.extend(idx.tolist())
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
        orders.append(tuple(seen))
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} first indices {seen[:5]}")
    with torch.no_grad():
        acc = (model(X).argmax(1) == y).float().mean().item()
    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps({"distinct_epoch_orders": len(set(orders)), "accuracy": acc}))


if __name__ == "__main__":
    main()
