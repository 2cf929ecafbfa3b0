"""Train ShapesNet: `python train.py --epochs 6`, or on several processes with
`torchrun --nproc-per-node=2 train.py`. Writes one JSON line per epoch to --log-file and a checkpoint that
--resume continues from."""
import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn

from data import loaders
from model import ShapesNet


def evaluate(model: nn.Module, loader) -> float:
    """Accuracy on `loader`, in [0, 1]."""
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for images, labels in loader:
            correct += (model(images).argmax(dim=1) == labels).sum().item()
            total += len(labels)
    return correct / total


def save(path: str, model, optimizer, epoch: int) -> None:
    """Write the checkpoint atomically: a crash mid-write leaves the previous one intact."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch,
             "rng": torch.get_rng_state()}                  # dropout's masks continue where they were
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--checkpoint", default="checkpoint.pt")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--log-file", default="train_log.jsonl")
    args = parser.parse_args()

    distributed = "RANK" in os.environ
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    torch.manual_seed(0)                                  # the same initial weights on every rank

    train_loader, val_loader, sampler = loaders(args.batch_size, rank, world_size)
    model = ShapesNet()
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    start_epoch = 0
    if args.resume:
        checkpoint = torch.load(args.checkpoint, map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch = checkpoint["epoch"] + 1
        torch.set_rng_state(checkpoint["rng"])

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        total_loss = 0.0
        for images, labels in train_loader:
            optimizer.zero_grad()
            loss = loss_fn(model(images), labels)
            loss.backward()
            optimizer.step()
            total_loss += loss.item()
        accuracy = evaluate(model, val_loader)
        record = {"epoch": epoch, "loss": total_loss / len(train_loader), "val_accuracy": accuracy,
                  "first_batch": sampler_first_indices(sampler)}
        if rank == 0:
            print(json.dumps(record), flush=True)
            with open(args.log_file, "a") as log:
                log.write(json.dumps(record) + "\n")
            save(args.checkpoint, model, optimizer, epoch)
    if distributed:
        dist.destroy_process_group()


def sampler_first_indices(sampler, k: int = 4) -> list[int]:
    """The first `k` sample indices this rank saw this epoch (to compare epochs' orders)."""
    return list(iter(sampler))[:k]


if __name__ == "__main__":
    main()
