"""Predicted vs measured peak memory of one training step, for three kinds of model.

Run: .venv/bin/python benchmarks/memory_estimate.py   (on CUDA when available, else CPU)
Not a timed test: it prints, for each model x optimizer x batch size, the sum-of-parts estimate
(`estimate_training_memory`), the simulated peak (`simulate_training_step`), the measured peak of a
real first step (`measure_peak_memory`), their errors and the time one simulation took; then one
simulation of a ~134M-parameter language model whose step needs tens of GiB, with its time and the
real memory it used (first, so that the process's peak resident memory measures it alone).
"""
import resource
import time

import torch
from torch import nn

from course_utils import (SmallConvNet, TransformerBlock, estimate_training_memory, get_device, hardware_summary,
                          measure_peak_memory, mlp)
from course_utils.memory_simulation import OPTIMIZERS, simulate_training_step


def measured_peak(model: nn.Module, x: torch.Tensor, optimizer: str) -> int:
    """The peak of one real first step above what existed before it (model, optimizer, batch)."""
    opt = OPTIMIZERS[optimizer](list(model.parameters()))

    def step() -> None:
        model(x).float().pow(2).mean().backward()
        opt.step()
    peak = measure_peak_memory(step, device=x.device).peak_bytes
    model.zero_grad(set_to_none=True)
    return peak


def warm_up(model: nn.Module, x: torch.Tensor) -> None:
    """Libraries allocate lazily on first use (cuBLAS's workspace, cuDNN's): not part of a step."""
    model(x[:1]).float().pow(2).mean().backward()
    model.zero_grad(set_to_none=True)


class LanguageModel(nn.Module):
    """GPT-2-small-sized: 32k vocabulary, 12 blocks of width 768."""

    def __init__(self, vocab: int = 32_000, dim: int = 768, layers: int = 12):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.Sequential(*[TransformerBlock(dim, 12) for _ in range(layers)])
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:   # (N, T) int64 -> (N, T, vocab)
        return self.out(self.blocks(self.embed(ids)))


def main() -> None:
    device = get_device()
    print(hardware_summary())
    with torch.device("meta"):                               # no real weights either
        lm = LanguageModel()
    params = sum(p.numel() for p in lm.parameters())
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    sim = simulate_training_step(lm, torch.empty(16, 1024, dtype=torch.long, device="meta"), optimizer="adamw")
    seconds = time.perf_counter() - start
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024   # ru_maxrss: KiB on Linux
    print(f"\n{params / 1e6:.0f}M-parameter language model, batch 16 x 1024 tokens, AdamW:")
    print(sim)
    print(f"one simulation took {seconds:.1f} s; the process's peak resident memory grew by {grown_mib:.0f} MiB")

    cases = [
        ("MLP 512-1024-1024-10", mlp([512, 1024, 1024, 10]), (512,)),
        ("SmallConvNet 3x64x64", SmallConvNet(), (3, 64, 64)),
        ("TransformerBlock 128, T=64", TransformerBlock(128, 4), (64, 128)),
    ]
    print(f"\n{'model':<28}{'opt':<6}{'batch':>6}{'sum of parts':>14}{'simulated':>12}{'measured':>12}"
          f"{'err parts':>11}{'err sim':>9}{'sim s':>7}")
    worst_parts = worst_sim = 0.0
    for name, model, shape in cases:
        model = model.to(device)
        for optimizer in ("sgd", "adam"):
            for n in (8, 32, 128):
                x = torch.randn(n, *shape, device=device)
                warm_up(model, x)
                parts = estimate_training_memory(model, x, optimizer=optimizer)
                parts_bytes = parts.total - parts.parameters
                sim = simulate_training_step(model, x, optimizer=optimizer)
                real = measured_peak(model, x, optimizer)
                err_parts, err_sim = parts_bytes / real - 1, sim.peak_bytes / real - 1
                worst_parts, worst_sim = max(worst_parts, abs(err_parts)), max(worst_sim, abs(err_sim))
                print(f"{name:<28}{optimizer:<6}{n:>6}{parts_bytes / 2**20:>11.2f} MiB{sim.peak_bytes / 2**20:>8.2f} MiB"
                      f"{real / 2**20:>8.2f} MiB{err_parts:>+11.1%}{err_sim:>+9.1%}{sim.seconds:>7.2f}")
    print(f"\nworst error against the measured peak: sum of parts {worst_parts:.1%}, simulation {worst_sim:.1%} "
          "(18 configurations)")


if __name__ == "__main__":
    main()
