"""What a learner will pass by mistake, for every public helper: a clear error naming the argument
and what to pass instead — never a deep traceback from inside PyTorch, never a silent wrong answer."""
import traceback
from pathlib import Path

import pytest
import torch
from torch import nn

import course_utils as cu

MODEL = cu.mlp([4, 8, 2])
X = torch.randn(2, 4)


def _optimizer():
    return torch.optim.SGD(MODEL.parameters(), lr=0.1)


# (id, call(tmp_path), exception type, words the message must contain)
CASES = [
    # a tensor where a module is expected, and the reverse
    ("save_checkpoint/model=tensor", lambda d: cu.save_checkpoint(d / "a.pt", model=torch.randn(3)), TypeError, "model must be an nn.Module"),
    ("load_checkpoint/model=tensor", lambda d: cu.load_checkpoint(d / "a.pt", model=torch.randn(3)), TypeError, "model must be an nn.Module"),
    ("load_matching_state_dict/state_dict=module", lambda d: cu.load_matching_state_dict(MODEL, MODEL), TypeError, "pass its .state_dict()"),
    ("load_matching_state_dict/model=dict", lambda d: cu.load_matching_state_dict(MODEL.state_dict(), MODEL.state_dict()), TypeError, "model must be an nn.Module"),
    ("export_onnx/model=tensor", lambda d: cu.export_onnx(torch.randn(3), (X,), d / "m.onnx"), TypeError, "model must be an nn.Module"),
    ("export_onnx/inputs=tensor", lambda d: cu.export_onnx(MODEL, X, d / "m.onnx"), TypeError, "example_inputs must be a tuple"),
    ("try_compile/model=tensor", lambda d: cu.try_compile(torch.randn(3), X), TypeError, "model must be an nn.Module"),
    ("count_compilations/inputs=tensor", lambda d: cu.count_compilations(MODEL, X), TypeError, "inputs must be a list of tensors"),
    ("benchmark/fns=module", lambda d: cu.benchmark(MODEL, X), TypeError, "fns must be a dict"),
    ("simulate_training_step/model=tensor", lambda d: cu.simulate_training_step(X, X), TypeError, "model must be an nn.Module"),
    ("simulate_training_step/input=module", lambda d: cu.simulate_training_step(MODEL, MODEL), TypeError, "example_input must be a tensor"),
    ("estimate_training_memory/input=module", lambda d: cu.estimate_training_memory(MODEL, MODEL), TypeError, "example_input must be a tensor"),
    ("check_devices/model=tensor", lambda d: cu.check_devices(X, X), TypeError, "model must be an nn.Module"),
    ("find_unregistered_modules/model=tensor", lambda d: cu.find_unregistered_modules(X), TypeError, "model must be an nn.Module"),
    ("explain/int", lambda d: cu.explain(3), TypeError, "explain takes an exception or a message"),
    ("estimate_training_memory/model=tensor", lambda d: cu.estimate_training_memory(X, X), TypeError, "model must be an nn.Module"),
    ("locate_nonfinite/model=tensor", lambda d: cu.locate_nonfinite(X, X), TypeError, "model must be an nn.Module"),
    ("find_nonfinite/module", lambda d: cu.find_nonfinite(MODEL), TypeError, "use locate_nonfinite"),
    ("snapshot/tensor", lambda d: cu.snapshot(X), TypeError, "model must be an nn.Module"),
    ("train_step/model=tensor", lambda d: cu.train_step(X, (X, X), nn.MSELoss(), _optimizer()), TypeError, "model must be an nn.Module"),
    ("measure_peak_memory/tensor", lambda d: cu.measure_peak_memory(X), TypeError, "fn must be a function"),
    ("saved_activation_bytes/int", lambda d: cu.saved_activation_bytes(3), TypeError, "fn must be a function"),
    # empty, dict or wrongly sized batches and sizes
    ("train_step/dict batch", lambda d: cu.train_step(MODEL, {"x": X, "y": X}, nn.MSELoss(), _optimizer()), TypeError, "(inputs, targets) pair"),
    ("train_step/empty batch", lambda d: cu.train_step(MODEL, (torch.empty(0, 4), torch.empty(0, 2)), nn.MSELoss(), _optimizer()), ValueError, "the batch is empty"),
    ("mlp/negative size", lambda d: cu.mlp([4, -1]), ValueError, "whole numbers >= 1"),
    ("TransformerBlock/heads", lambda d: cu.TransformerBlock(10, 3), ValueError, "must be divisible by heads"),
    ("compare_pinned_copy/nbytes<0", lambda d: cu.compare_pinned_copy(-1, "cuda"), ValueError, "nbytes must be"),
    ("train_accumulated/no micro-batches", lambda d: cu.train_accumulated(MODEL, [], nn.MSELoss(), _optimizer()), ValueError, "micro_batches is empty"),
    ("evaluate/empty loader", lambda d: cu.evaluate(MODEL, [], nn.MSELoss()), ValueError, "yielded no samples"),
    ("fit/epochs=0", lambda d: cu.fit(MODEL, [], nn.MSELoss(), _optimizer(), epochs=0), ValueError, "epochs must be >= 1"),
    ("benchmark_loader/list", lambda d: cu.benchmark_loader([]), TypeError, "needs a torch.utils.data.DataLoader"),
    ("SyntheticImages/n=0", lambda d: cu.SyntheticImages(n=0), ValueError, "need n >= 1"),
    ("verify_onnx/no inputs", lambda d: cu.verify_onnx(MODEL, d / "m.onnx", []), ValueError, "inputs_list is empty"),
    ("benchmark/no functions", lambda d: cu.benchmark({}, X), ValueError, "fns is empty"),
    ("mlp/one size", lambda d: cu.mlp([4]), ValueError, "at least an input and an output size"),
    ("global_batch_size/0", lambda d: cu.global_batch_size(0), ValueError, "per_device must be a positive int"),
    ("shard_indices/n<0", lambda d: cu.shard_indices(-1, 0, 2), ValueError, "n (the number of samples) must be >= 0"),
    ("shard_indices/rank>=world", lambda d: cu.shard_indices(10, 2, 2), ValueError, "0 <= rank < world_size"),
    ("seed_everything/-1", lambda d: cu.seed_everything(-1), ValueError, "seed must be in"),
    ("seed_everything/str", lambda d: cu.seed_everything("a"), TypeError, "seed must be an int"),
    ("seed_for_rank/str", lambda d: cu.seed_for_rank("x"), ValueError, "base_seed must be a non-negative int"),
    ("find_max_batch_size/limit=0", lambda d: cu.find_max_batch_size(lambda n: None, limit=0, budget_bytes=10), ValueError, "start <= limit"),
    ("max_batch_size_by_simulation/budget=0", lambda d: cu.max_batch_size_by_simulation(MODEL, X, budget_bytes=0), ValueError, "budget_bytes > 0"),
    ("fit_line/lr=0", lambda d: cu.fit_line(torch.randn(5, 1), torch.randn(5, 1), lr=0), ValueError, "need lr > 0"),
    ("plot_losses/empty", lambda d: cu.plot_losses({}), ValueError, "histories is empty"),
    ("launch_torchrun/nproc=0", lambda d: cu.launch_torchrun("course_utils.ddp_train", 0), ValueError, "nproc must be"),
    ("check_resume/stop_at=steps", lambda d: cu.check_resume("course_utils.resume:_main", steps=3, stop_at=3), ValueError, "0 < stop_at < steps"),
    ("idle_cores/0", lambda d: cu.idle_cores(0), ValueError, "interval_s must be positive"),
    ("restore_rng_state/empty", lambda d: cu.restore_rng_state({}), KeyError, "made by capture_rng_state"),
    # devices that do not exist
    ("to_device/'gpu'", lambda d: cu.to_device(X, "gpu"), ValueError, "device must be a device such as"),
    ("choose_autocast/'gpu'", lambda d: cu.choose_autocast("gpu"), ValueError, "device must be a device such as"),
    ("saved_as_if_on/'gpu'", lambda d: cu.saved_as_if_on("gpu").__enter__(), ValueError, "location must be a device"),
    # paths: a folder, a file that is not a checkpoint, a launch target or ONNX file that does not exist
    ("save_checkpoint/folder", lambda d: cu.save_checkpoint(d, model=MODEL), IsADirectoryError, "path is a folder"),
    ("load_checkpoint/folder", lambda d: cu.load_checkpoint(d, model=MODEL), FileNotFoundError, "it is a folder"),
    ("load_checkpoint/missing", lambda d: cu.load_checkpoint(d / "missing.pt", model=MODEL), FileNotFoundError, "no checkpoint at"),
    ("load_checkpoint/not a checkpoint", lambda d: cu.load_checkpoint(_text_file(d), model=MODEL), cu.CheckpointError, "not a file torch.save wrote"),
    ("export_onnx/folder", lambda d: cu.export_onnx(MODEL, (X,), d), IsADirectoryError, "path is a folder"),
    ("onnx_session/missing", lambda d: cu.onnx_session(d / "missing.onnx"), FileNotFoundError, "no ONNX file"),
    ("verify_onnx/missing", lambda d: cu.verify_onnx(MODEL, d / "missing.onnx", [(X,)]), FileNotFoundError, "no ONNX file"),
    ("launch_torchrun/no module", lambda d: cu.launch_torchrun("course_utils.no_such_script", 2), ModuleNotFoundError, "no module named"),
    ("launch_torchrun/no script", lambda d: cu.launch_torchrun(str(d / "train.py"), 2), FileNotFoundError, "no training script"),
    ("check_resume/no script", lambda d: cu.check_resume(f"{d / 'job.py'}:run", steps=3, stop_at=1), FileNotFoundError, "no training script"),
    ("check_resume/bad target", lambda d: cu.check_resume("job.run", steps=3, stop_at=1), ValueError, "package.module:function"),
    ("worker_pids/missing folder", lambda d: cu.worker_pids(d / "runs"), FileNotFoundError, "no log folder"),
]


def _text_file(folder: Path) -> Path:
    path = folder / "notes.pt"
    path.write_text("not a checkpoint")
    return path


@pytest.mark.parametrize("call, error, words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_wrong_argument_gets_a_clear_error(call, error, words, tmp_path):
    with pytest.raises(error) as raised:
        call(tmp_path)
    assert words in str(raised.value), str(raised.value)
    # raised by the course's own check, not from deep inside a library
    last = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert "site-packages" not in last.filename, f"raised inside {last.filename}:{last.lineno}"
