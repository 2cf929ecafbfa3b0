"""`diagnose`: the mechanics of running a plain script under observation (timeouts, crashes, the step
budget, torchrun scripts, DataLoader workers, torch.compile, the CLI). What it finds is measured on
the benchmark of buggy and fixed scripts (tests/test_diagnosis_benchmark.py)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from course_utils import Diagnosis, diagnose
from course_utils.diagnosis_rules import Finding, findings_from

pytestmark = pytest.mark.slow

TRAIN = """
import torch
from torch import nn
torch.manual_seed(0)
X = torch.randn(256, 8); Y = (X[:, 0] > 0).long()
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range({steps}):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(X), Y)
    loss.backward()
    {step_line}
"""


def script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_a_healthy_script_gets_no_finding_and_keeps_its_output(tmp_path):
    path = script(tmp_path, TRAIN.format(steps=30, step_line="opt.step()") + "print('final', float(loss))\n")
    result = diagnose(path)
    assert result.healthy and result.findings == [] and result.status == "finished"
    assert result.steps == 30 and result.returncode == 0
    assert "final" in result.output_tail
    assert "No problem found" in str(result)


def test_the_script_runs_as_main_with_its_arguments_and_folder_on_the_path(tmp_path):
    script(tmp_path, "VALUE = 41\n", name="helper_module.py")
    path = script(tmp_path, """
        import sys
        from helper_module import VALUE
        if __name__ == "__main__":
            print("args", sys.argv[1:], VALUE + 1)
    """)
    result = diagnose(path, "--epochs", "3")
    assert "args ['--epochs', '3'] 42" in result.output_tail
    assert result.status == "finished"


def test_a_bug_is_named_with_its_chapter_and_evidence(tmp_path):
    path = script(tmp_path, TRAIN.format(steps=30, step_line="opt.step()").replace("    opt.zero_grad()\n", ""))
    result = diagnose(path)
    assert result.rules() == ["grad-not-cleared"]
    finding = result.findings[0]
    assert finding.chapter == 1 and "Sequential.0.weight" in finding.message
    assert finding.evidence["steps_with_stale_gradient"] == 29
    assert "[grad-not-cleared] (chapter 1)" in str(result)


def test_a_script_stopped_at_the_timeout_is_still_diagnosed(tmp_path):
    path = script(tmp_path, TRAIN.format(steps=10**9, step_line="opt.step()").replace("    opt.zero_grad()\n", ""))
    result = diagnose(path, timeout_s=8)
    assert result.status == "stopped at the timeout"
    assert result.steps > 10
    assert "grad-not-cleared" in result.rules()
    assert result.wall_s < 20


def test_the_step_budget_stops_a_long_script(tmp_path):
    path = script(tmp_path, TRAIN.format(steps=10**9, step_line="opt.step()"))
    result = diagnose(path, max_steps=25)
    assert result.steps == 25 and result.status.startswith("stopped after 25 optimizer steps")
    assert result.findings == []


def test_a_crash_is_explained_and_what_ran_before_is_diagnosed(tmp_path):
    path = script(tmp_path, TRAIN.format(steps=20, step_line="opt.step()").replace("    opt.zero_grad()\n", "")
                  + "model(torch.randn(4, 3))\n")
    result = diagnose(path)
    assert result.status == "crashed" and result.returncode == 1
    assert result.explanation is not None and result.explanation.id == "shape-mismatch"
    assert "mat1 and mat2 shapes cannot be multiplied" in result.evidence["crash"]
    assert "grad-not-cleared" in result.rules()
    assert not result.healthy and "The script crashed" in str(result)


def test_a_torchrun_script_runs_as_one_process(tmp_path):
    path = script(tmp_path, """
        import os
        import torch
        import torch.distributed as dist
        from torch import nn
        dist.init_process_group("gloo")
        model = nn.parallel.DistributedDataParallel(nn.Linear(4, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            opt.zero_grad(); model(torch.randn(8, 4)).pow(2).mean().backward(); opt.step()
        print("world", dist.get_world_size(), "rank", os.environ["RANK"])
        dist.destroy_process_group()
    """)
    result = diagnose(path)
    assert "world 1 rank 0" in result.output_tail
    assert result.healthy, str(result)


def test_dataloader_workers_and_torch_compile_run_unharmed(tmp_path):
    path = script(tmp_path, """
        import torch
        from torch import nn
        from torch.utils.data import DataLoader, TensorDataset
        if __name__ == "__main__":
            torch.manual_seed(0)
            data = TensorDataset(torch.randn(128, 4), torch.randn(128, 1))
            loader = DataLoader(data, batch_size=32, shuffle=True, num_workers=2)
            model = nn.Linear(4, 1)
            compiled = torch.compile(model, backend="eager")
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(2):
                for x, y in loader:
                    opt.zero_grad(); nn.functional.mse_loss(compiled(x), y).backward(); opt.step()
            print("done")
    """)
    result = diagnose(path)
    assert result.status == "finished" and "done" in result.output_tail
    assert result.healthy, str(result)
    assert result.evidence["observer_errors"] == []


def test_bad_input_gets_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no script at"):
        diagnose(tmp_path / "missing.py")
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        diagnose(script(tmp_path, "pass\n"), timeout_s=0)


def test_the_command_line_exits_non_zero_when_something_is_found(tmp_path):
    healthy = script(tmp_path, TRAIN.format(steps=10, step_line="opt.step()"), "healthy.py")
    buggy = script(tmp_path, TRAIN.format(steps=10, step_line="pass"), "buggy.py")
    run = [sys.executable, "-m", "course_utils", "diagnose"]
    ok = subprocess.run(run + [str(healthy)], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "No problem found" in ok.stdout
    bad = subprocess.run(run + [str(buggy)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and "[optimizer-not-stepped] (chapter 2)" in bad.stdout
    usage = subprocess.run(run + [str(tmp_path / "nope.py")], capture_output=True, text=True, timeout=120)
    assert usage.returncode == 2 and "no script at" in usage.stderr


def test_rules_read_evidence_not_text():
    """The rules see only the observer's numbers: the same evidence gives the same findings."""
    evidence = {"status": "finished", "steps": 10, "backwards": 10, "params": [], "roots": [], "no_grad_steps": [],
                "zeroed_before_step": [], "grad_norms": {"names": [], "steps": [], "values": []},
                "losses": {"steps": [], "values": []}, "nonfinite": {}, "loss_checks": [], "broadcasts": [],
                "labels": {"calls": 0, "single_class": 0, "classes": 0}, "loaders": [], "optimizer_state": False,
                "dist_samplers": [{"shuffle": True, "epochs": [0, 0, 0]}], "activations": {},
                "fp16": {"half_grad_steps": 0, "zero_fraction": [], "scaler_used": False, "autocast_fp16_forwards": 0},
                "checkpoints": {"loads": [], "saves": 0, "optimizer_loads": 0, "model_loads": 0},
                "eval_graph_forwards": 0, "eval_graph_unused": 0, "graph_nodes": {"steps": [], "values": []},
                "dynamo": {}}
    (finding,) = findings_from(evidence)
    assert isinstance(finding, Finding) and finding.rule == "sampler-without-set-epoch" and finding.chapter == 5
    evidence["dist_samplers"][0]["epochs"] = [0, 1, 2]
    assert findings_from(evidence) == []
    assert isinstance(Diagnosis("x.py", "finished", 10, 1.0), Diagnosis)


def test_activation_checkpointing_runs_unharmed(tmp_path):
    """torch.utils.checkpoint re-runs the forward in backward and demands it save exactly what the first run
    saved: the observer must neither record graphs of its own nor observe the recomputation."""
    path = script(tmp_path, """
        import torch
        from torch import nn
        from torch.utils.checkpoint import checkpoint
        torch.manual_seed(0)
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.inner = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
                self.head = nn.Linear(8, 1)
            def forward(self, x):
                return self.head(x + checkpoint(self.inner, x, use_reentrant=False))
        model = Net()
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(20):
            opt.zero_grad(); model(torch.randn(32, 8)).pow(2).mean().backward(); opt.step()
        print("done")
    """)
    result = diagnose(path)
    assert result.status == "finished" and "done" in result.output_tail, result.output_tail
    assert result.healthy and result.evidence["observer_errors"] == []
