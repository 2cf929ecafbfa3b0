"""Chapter 5: a real DistributedDataParallel training script, launched by torchrun.

    torchrun --standalone --nproc-per-node=2 -m course_utils.ddp_train --log-dir runs/ddp

Each rank writes `rank{RANK}.json` to --log-dir: the environment it saw, the batch sizes, the data
order of every epoch, its first augmentation draws, its loss curve, a fingerprint of its final
weights, the checkpoints it wrote and its evaluation counts. Flags switch the classic pitfalls on.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from course_utils import cuda_evidence
from course_utils.checkpoints import load_checkpoint, save_checkpoint
from course_utils.distributed import LOG_DIR_ENV, global_batch_size, is_main_process, seed_for_rank, shard_indices
from course_utils.models import mlp


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--log-dir", type=Path, default=os.environ.get(LOG_DIR_ENV),
                        help=f"where each rank writes its log (default: ${LOG_DIR_ENV}, set by launch_torchrun)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--per-device-batch", type=int, default=8)
    parser.add_argument("--train-size", type=int, default=50, help="deliberately not a multiple of the world size")
    parser.add_argument("--val-size", type=int, default=21)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--num-workers", type=int, default=1,
                        help="DataLoader workers per rank (x ranks per machine: keep it within the cores)")
    pitfalls = parser.add_argument_group("pitfalls (each off by default)")
    pitfalls.add_argument("--no-set-epoch", action="store_true", help="forget sampler.set_epoch(epoch)")
    pitfalls.add_argument("--same-seed", action="store_true", help="seed every rank identically")
    pitfalls.add_argument("--all-ranks-save", action="store_true", help="every rank writes the checkpoint")
    pitfalls.add_argument("--crash-rank", type=int, default=None, help="raise an error on this rank")
    pitfalls.add_argument("--sleep", type=float, default=0.0, help="sleep this long before training (timeouts)")
    return parser.parse_args(argv)


def make_data(n: int, seed: int) -> TensorDataset:
    """`n` samples of (x: (4,) float, y: (1,) float), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [0.0]]) + 0.3)


def fingerprint(model: nn.Module) -> str:
    """SHA-256 of every parameter's bytes: equal fingerprints mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def evaluate_distributed(model: nn.Module, dataset: TensorDataset, indices, device: torch.device) -> dict:
    """Summed squared error and sample count over `indices`, all-reduced over ranks."""
    totals = torch.zeros(2, dtype=torch.float64, device=device)  # (sum of losses, count)
    with torch.inference_mode():
        for start in range(0, len(indices), 16):
            x, y = dataset[list(indices[start:start + 16])]
            x, y = x.to(device), y.to(device)
            totals[0] += ((model(x) - y) ** 2).sum().double()
            totals[1] += len(x)
    dist.all_reduce(totals)
    total, count = totals.tolist()
    return {"count": int(count), "mean_loss": total / count if count else float("nan")}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.log_dir is None:
        raise SystemExit("give --log-dir, or launch through launch_torchrun(..., log_dir=...) which sets $COURSE_LOG_DIR")
    if "RANK" not in os.environ:
        raise SystemExit("run me under torchrun: torchrun --standalone --nproc-per-node=2 -m course_utils.ddp_train ...")
    rank, local_rank, world = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() >= local_world  # every rank has a GPU
    backend = "nccl" if use_cuda else "gloo"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    args.log_dir.mkdir(parents=True, exist_ok=True)
    (args.log_dir / f"pid{rank}").write_text(str(os.getpid()))
    dist.init_process_group(backend, device_id=device if use_cuda else None)
    try:
        log = train(args, rank, local_rank, world, backend, device)
        (args.log_dir / f"rank{rank}.json").write_text(json.dumps(log, indent=1))
        cuda_evidence.record()   # in a GPU test run: this worker's CUDA use counts for its notebook
        dist.barrier()  # leave together: a rank tearing down while a peer still talks can abort it
    finally:
        dist.destroy_process_group()  # on every exit path, errors included


def train(args: argparse.Namespace, rank: int, local_rank: int, world: int, backend: str, device: torch.device) -> dict:
    if args.crash_rank == rank:
        raise RuntimeError(f"deliberate crash on rank {rank} (--crash-rank)")
    time.sleep(args.sleep)
    torch.manual_seed(args.seed)                      # the same initial model everywhere (DDP also broadcasts rank 0's)
    model = DistributedDataParallel(mlp([4, 16, 1]).to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    aug_seed = args.seed if args.same_seed else seed_for_rank(args.seed)
    augment = torch.Generator(device="cpu").manual_seed(aug_seed)
    train_set = make_data(args.train_size, seed=1)
    sampler = DistributedSampler(train_set, shuffle=True, seed=args.seed)   # pads so every rank gets as many
    loader = DataLoader(train_set, batch_size=args.per_device_batch, sampler=sampler, num_workers=args.num_workers,
                        persistent_workers=args.num_workers > 0,  # the same workers every epoch
                        pin_memory=device.type == "cuda")          # page-locked batches: faster copies to the GPU
    log: dict = {
        "rank": rank, "local_rank": local_rank, "world_size": world, "backend": backend, "device": str(device),
        "pid": os.getpid(),
        "env": {k: os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")},
        "per_device_batch": args.per_device_batch, "global_batch": global_batch_size(args.per_device_batch),
        "augmentation_seed": aug_seed, "epoch_orders": [], "augmentation_draws": [], "losses": [],
    }
    print(f"[rank {rank}/{world}] backend={backend} device={device} per-device batch {args.per_device_batch}"
          f" -> global batch {log['global_batch']}", flush=True)
    for epoch in range(args.epochs):
        if not args.no_set_epoch:
            sampler.set_epoch(epoch)                  # a new shuffle each epoch, the same on all ranks
        log["epoch_orders"].append(list(sampler))
        for x, y in loader:
            noise = torch.randn(x.shape, generator=augment) * 0.01    # "augmentation"
            if len(log["augmentation_draws"]) < 4:
                log["augmentation_draws"].append(round(noise[0, 0].item(), 6))
            optimizer.zero_grad(set_to_none=True)
            loss = nn.functional.mse_loss(model((x + noise).to(device)), y.to(device))
            loss.backward()                           # DDP all-reduces (averages) the gradients here
            optimizer.step()
            log["losses"].append(loss.item())
    log["weights_fingerprint"] = fingerprint(model.module)

    checkpoint = args.log_dir / "checkpoint.pt"
    log["checkpoint_writes"] = 0
    if args.all_ranks_save or is_main_process():
        save_checkpoint(checkpoint, model=model.module, optimizer=optimizer, epoch=args.epochs, saved_by_rank=rank)
        log["checkpoint_writes"] = 1
    dist.barrier()                                    # nobody reads before rank 0 has finished writing
    reloaded = mlp([4, 16, 1]).to(device)
    log["checkpoint_meta"] = load_checkpoint(checkpoint, model=reloaded, restore_rng=False)
    log["checkpoint_matches_my_weights"] = fingerprint(reloaded) == log["weights_fingerprint"]

    val_set = make_data(args.val_size, seed=2)
    padded = list(DistributedSampler(val_set, shuffle=False))            # the naive way: padded shards
    log["eval_naive"] = evaluate_distributed(model.module, val_set, padded, device)
    log["eval_correct"] = evaluate_distributed(model.module, val_set, shard_indices(len(val_set), rank, world), device)
    return log


if __name__ == "__main__":
    main()
