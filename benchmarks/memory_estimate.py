"""Estimate vs measured peak memory of one training step, for three kinds of model.

Run: .venv/bin/python benchmarks/memory_estimate.py   (on CUDA when available, else CPU)
Not a timed test: it prints a table and the worst relative error, for the chapter 3 notes.
"""
import torch

from course_utils import SmallConvNet, TransformerBlock, check_memory_estimate, get_device, hardware_summary, mlp

device = get_device()
print(hardware_summary())
cases = [
    ("MLP 512-1024-1024-10", mlp([512, 1024, 1024, 10]), (512,)),
    ("SmallConvNet, 3x64x64", SmallConvNet(), (3, 64, 64)),
    ("TransformerBlock dim 128, T=64", TransformerBlock(128, 4), (64, 128)),
]
worst = 0.0
for name, model, shape in cases:
    for optimizer in ("sgd", "adam"):
        check = check_memory_estimate(model.to(device), shape, [8, 32, 128], optimizer=optimizer,
                                      model_name=f"{name}, {optimizer}")
        print(check, end="\n\n")
        worst = max(worst, check.worst_relative_error)
print(f"worst relative error |measured / estimated - 1| = {worst:.0%}")
