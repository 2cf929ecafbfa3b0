"""Chapter 5: distributed helpers, and the DDP script end to end under a real torchrun."""
import os
import time

import pytest
import torch

from course_utils.distributed import (TorchrunFailed, global_batch_size, is_main_process, launch_torchrun,
                                      rank_zero_only, seed_for_rank, shard_indices, still_running, worker_pids)


def test_helpers_outside_a_process_group(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert is_main_process() and seed_for_rank(10) == 10 and global_batch_size(8) == 8
    monkeypatch.setenv("RANK", "2")
    assert not is_main_process() and seed_for_rank(10) == 12
    assert global_batch_size(8) == 8          # no process group: world size 1


def test_rank_zero_only(monkeypatch):
    calls = []

    @rank_zero_only
    def save(x):
        """Docstring kept."""
        calls.append(x)
        return "saved"
    monkeypatch.setenv("RANK", "0")
    assert save(1) == "saved"
    monkeypatch.setenv("RANK", "1")
    assert save(2) is None
    assert calls == [1] and save.__doc__ == "Docstring kept."


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_helpers_reject_bad_input(bad):
    with pytest.raises(ValueError):
        seed_for_rank(bad)
    with pytest.raises(ValueError):
        global_batch_size(bad if bad != -1 else 0)


@pytest.mark.parametrize("n, world", [(7, 1), (7, 2), (7, 3), (2, 3), (0, 2)])
def test_shard_indices_cover_every_sample_exactly_once(n, world):
    shards = [list(shard_indices(n, rank, world)) for rank in range(world)]
    assert sorted(i for shard in shards for i in shard) == list(range(n))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    with pytest.raises(ValueError):
        shard_indices(n, world, world)


@pytest.mark.slow
def test_two_process_gloo_run_end_to_end(tmp_path):
    result = launch_torchrun("course_utils.ddp_train", 2, "--epochs", "2",
                             log_dir=tmp_path, echo=False)
    assert result.returncode == 0 and [log["rank"] for log in result.logs] == [0, 1]
    first, second = result.logs
    assert first["backend"] == ("nccl" if torch.cuda.device_count() >= 2 else "gloo")
    assert first["env"]["WORLD_SIZE"] == "2" and second["env"]["RANK"] == "1"
    assert first["weights_fingerprint"] == second["weights_fingerprint"]       # gradients were all-reduced
    assert first["global_batch"] == 16 and first["per_device_batch"] == 8
    assert first["epoch_orders"][0] != first["epoch_orders"][1]                # set_epoch reshuffles
    assert first["augmentation_draws"] != second["augmentation_draws"]         # base_seed + rank
    assert first["checkpoint_meta"]["saved_by_rank"] == 0
    assert first["checkpoint_writes"] + second["checkpoint_writes"] == 1
    assert all(log["checkpoint_matches_my_weights"] for log in result.logs)
    assert first["eval_correct"]["count"] == 21 and first["eval_naive"]["count"] == 22   # padding
    assert "global batch 16" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("world", [1, 2, 3])
def test_uneven_data_for_world_sizes_1_2_3(tmp_path, world):
    result = launch_torchrun("course_utils.ddp_train", world, "--epochs", "1",
                             "--train-size", "7", "--val-size", "2", "--per-device-batch", "2",
                             log_dir=tmp_path, echo=False)
    assert len(result.logs) == world
    assert len({log["weights_fingerprint"] for log in result.logs}) == 1
    for log in result.logs:
        assert log["eval_correct"]["count"] == 2                 # each validation sample once, even with an empty shard
        assert log["eval_correct"]["mean_loss"] == log["eval_correct"]["mean_loss"]  # not nan
        assert len(log["epoch_orders"][0]) == -(-7 // world)     # padded: every rank the same count


@pytest.mark.slow
def test_a_crashing_rank_is_reported_and_nothing_is_left_running(tmp_path):
    with pytest.raises(TorchrunFailed, match="(?s)Traceback.*deliberate crash on rank 1"):
        launch_torchrun("course_utils.ddp_train", 2, "--crash-rank", "1",
                        log_dir=tmp_path, echo=False, timeout_s=120)
    time.sleep(0.5)
    assert len(worker_pids(tmp_path)) == 2 and still_running(worker_pids(tmp_path)) == []


@pytest.mark.slow
def test_timeout_kills_every_process(tmp_path):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="killed"):
        launch_torchrun("course_utils.ddp_train", 2, "--sleep", "120",
                        log_dir=tmp_path, echo=False, timeout_s=15)
    assert time.monotonic() - start < 40
    pids = worker_pids(tmp_path)
    assert len(pids) == 2 and still_running(pids) == []


def test_script_refuses_to_run_outside_torchrun(tmp_path, monkeypatch):
    from course_utils import ddp_train
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(SystemExit, match="torchrun"):
        ddp_train.main(["--log-dir", str(tmp_path)])


def test_still_running_tells_live_from_finished_processes():
    import subprocess
    import sys
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    assert still_running([os.getpid(), int(finished.stdout)]) == [os.getpid()]


def test_launch_rejects_bad_nproc():
    with pytest.raises(ValueError, match="nproc"):
        launch_torchrun("course_utils.ddp_train", 0)


def test_a_missing_target_fails_before_any_process_starts(tmp_path):
    start = time.monotonic()
    with pytest.raises(ModuleNotFoundError, match="no module named 'course_utils.ddp_trian'"):
        launch_torchrun("course_utils.ddp_trian", 2, log_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no training script"):
        launch_torchrun(str(tmp_path / "train.py"), 2, log_dir=tmp_path)
    assert time.monotonic() - start < 2 and not list(tmp_path.iterdir())     # nothing ran, nothing written


def test_the_script_refuses_to_run_without_a_log_folder(monkeypatch):
    from course_utils import ddp_train
    monkeypatch.delenv("COURSE_LOG_DIR", raising=False)
    with pytest.raises(SystemExit, match="give --log-dir"):
        ddp_train.main([])
