import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class IndexedBlobs(Dataset):
    """Two-class blobs; items carry their index so the order can be logged."""

    def __init__(self, n=512):
        g = torch.Generator().manual_seed(0)
        self.y = torch.randint(0, 2, (n,), generator=g)
        self.x = torch.randn(n, 4, generator=g) + 1.5 * self.y[:, None].float()

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i], i


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dataset = IndexedBlobs()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)

    first_batches = []
    n_epochs = 5
    for epoch in range(n_epochs):
        for step, (xb, yb, idx) in enumerate(loader):
            if step == 0:
                first_batches.append(tuple(idx.tolist()))
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f} first ids {first_batches[-1][:4]}")

    dist.destroy_process_group()
    if rank == 0:
        print("RESULT " + json.dumps({"distinct_epoch_orders": len(set(first_batches)), "epochs": n_epochs,
                                      "final_loss": round(loss.item(), 4), "world_size": int(os.environ.get("WORLD_SIZE", 1))}))


if __name__ == "__main__":
    main()
