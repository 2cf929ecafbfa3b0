"""Chapter 5: distributed helpers and the DDP script end to end under a real torchrun (the exercise checks are
tested in test_exercises_ddp_torchrun.py)."""
import os
import pickle
import re
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from course_utils.distributed import (TorchrunFailed, count_allreduces, free_port, free_ports, global_batch_size,
                                      is_main_process, launch_torchrun, rank_zero_only, script_variant,
                                      seed_for_rank, shard_indices, single_process_group, still_running,
                                      worker_pids)


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
def test_a_rank_killed_by_a_signal_is_named_from_torchruns_summary(tmp_path):
    # The killed rank prints no traceback; its peer's only says the connection went. torchrun's summary
    # is the one place that names the rank and the signal.
    script = tmp_path / "killed.py"
    script.write_text("import datetime, os, signal\nimport torch\nimport torch.distributed as dist\n"
                      "dist.init_process_group('gloo', timeout=datetime.timedelta(seconds=30))\n"
                      "if dist.get_rank() == 1:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
                      "dist.all_reduce(torch.ones(1))\n")
    with pytest.raises(TorchrunFailed) as failed:
        launch_torchrun(str(script), 2, echo=False, timeout_s=120)
    assert re.search(r"(?s)Root Cause.*rank\s*: 1 .*SIGKILL", str(failed.value))
    assert "Root Cause" in failed.value.result.output and failed.value.result.returncode != 0
    copy = pickle.loads(pickle.dumps(failed.value))             # e.g. raised inside a process pool
    assert str(copy) == str(failed.value) and copy.result.output == failed.value.result.output


@pytest.mark.slow
def test_timeout_kills_every_process(tmp_path):
    start = time.monotonic()
    with pytest.raises(TimeoutError, match="killed"):
        launch_torchrun("course_utils.ddp_train", 2, "--sleep", "120",
                        log_dir=tmp_path, echo=False, timeout_s=15)
    assert time.monotonic() - start < 40
    pids = worker_pids(tmp_path)
    assert len(pids) == 2 and still_running(pids) == []


def _children(pid: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:                  # field 4 of /proc/PID/stat: the parent's PID
            children.append(int(stat.parent.name))
    return children


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_killed_launcher_leaves_no_torchrun_and_no_worker_behind(tmp_path):
    """A Jupyter kernel restarted during a launch is SIGKILLed: torchrun and every worker must go too."""
    import signal
    import subprocess
    launcher = subprocess.Popen([sys.executable, "-c", (
        "from course_utils.distributed import launch_torchrun; "
        f"launch_torchrun('course_utils.ddp_train', 2, '--sleep', '300', log_dir={str(tmp_path)!r}, "
        "timeout_s=600, echo=False)")], cwd=Path(__file__).parent.parent)
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        workers = worker_pids(tmp_path)
        torchrun = _children(launcher.pid)
        assert len(workers) == 2 and len(torchrun) == 1 and still_running(workers + torchrun) == workers + torchrun
    finally:
        launcher.send_signal(signal.SIGKILL)          # no handler runs, no finally: block, no cleanup
        launcher.wait()
    deadline = time.monotonic() + 20
    while still_running(workers + torchrun) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert still_running(workers + torchrun) == [], "torchrun or a worker outlived the process that launched it"


def test_the_death_signal_is_set_on_linux_only(monkeypatch):
    from course_utils import distributed
    assert (distributed._dies_with_this_process() is not None) == sys.platform.startswith("linux")
    monkeypatch.setattr(sys, "platform", "darwin")
    assert distributed._dies_with_this_process() is None


@pytest.mark.slow
def test_extra_environment_reaches_the_workers(tmp_path):
    script = tmp_path / "env.py"
    # one os.write per worker: the two workers share torchrun's stdout, and print's pieces can interleave
    script.write_text("import os\nos.write(1, f\"seen {os.environ['RANK']} {os.environ.get('COURSE_TEST_VALUE')}\\n\".encode())\n")
    result = launch_torchrun(str(script), 2, env={"COURSE_TEST_VALUE": "42"}, echo=False)
    assert "seen 0 42" in result.output and "seen 1 42" in result.output


@pytest.mark.slow
def test_torchrun_leaves_no_empty_temporary_folder_behind_and_keeps_files(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))              # where this process makes temporary folders
    script = tmp_path / "tmp.py"
    script.write_text("import os, sys, tempfile\nos.write(1, f\"scratch {tempfile.gettempdir()}\\n\".encode())\n"
                      "if len(sys.argv) > 1 and os.environ['RANK'] == '0':\n"
                      "    open(os.path.join(tempfile.mkdtemp(), 'kept.txt'), 'w').write('a worker file')\n")
    result = launch_torchrun(str(script), 2, echo=False)
    assert result.output.count(f"scratch {tmp_path}/torchrun-") == 2        # the workers had one folder to write in
    assert [path.name for path in tmp_path.iterdir()] == ["tmp.py"]      # no torchelastic_* left, nor that folder
    launch_torchrun(str(script), 2, "--write", echo=False)
    assert [path.read_text() for path in tmp_path.glob("torchrun-*/*/kept.txt")] == ["a worker file"]
    assert not list(tmp_path.glob("torchrun-*/torchelastic_*"))


@pytest.mark.slow
def test_a_tmpdir_given_in_env_is_the_workers(tmp_path):
    script = tmp_path / "tmp.py"
    script.write_text("import os, tempfile\nos.write(1, f\"scratch {tempfile.gettempdir()}\\n\".encode())\n")
    result = launch_torchrun(str(script), 1, env={"TMPDIR": str(tmp_path)}, echo=False)
    assert f"scratch {tmp_path}\n" in result.output


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_process_reaped_between_the_two_checks_is_finished(monkeypatch):
    import subprocess
    # os.kill found it, then its parent reaped it before /proc/PID/status was read (a CI run hit this race)
    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    monkeypatch.setattr(os, "kill", lambda pid, signal: None)
    assert still_running([int(finished.stdout)]) == []


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


# --- chapter tools -------------------------------------------------------------------------

def test_script_variant_replaces_whole_lines_and_shows_the_diff(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("a = 1\n    sampler.set_epoch(epoch)  # DDP: reshuffle\nb = 2  # two\n")
    diff = script_variant(script, "set_epoch", "    pass  # forgotten", to=tmp_path / "bad.py")
    assert (tmp_path / "bad.py").read_text() == "a = 1\n    pass  # forgotten\nb = 2  # two\n"   # old comment gone
    assert "-    sampler.set_epoch(epoch)  # DDP: reshuffle\n" in diff and "+    pass  # forgotten\n" in diff
    assert "a = 1" not in diff
    diff = script_variant(script, "set_epoch", "", to=tmp_path / "deleted.py")
    assert (tmp_path / "deleted.py").read_text() == "a = 1\nb = 2  # two\n" and "+" not in diff.replace("+++", "")
    diff = script_variant(script, "b = 2", "b = 2\nc = 3", to=tmp_path / "two.py")
    assert (tmp_path / "two.py").read_text().endswith("b = 2\nc = 3\n") and "+b = 2\n+c = 3\n" in diff
    with pytest.raises(ValueError, match="exactly one"):
        script_variant(script, "missing", "x", to=tmp_path / "x.py")
    with pytest.raises(ValueError, match="exactly one"):
        script_variant(script, " = ", "x", to=tmp_path / "x.py")


def test_worker_traceback_keeps_the_learners_frames_and_the_error_line():
    from course_utils.distributed import _worker_traceback
    library = f"{sys.prefix}/lib/python3.11/site-packages/torch/autograd/graph.py"
    output = "\n".join([
        "W1203 some launcher warning",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "/somewhere/uneven.py", line 16, in <module>',
        "[rank0]:     model(x).backward()",
        f'[rank0]:   File "{library}", line 979, in _engine_run_backward',
        "[rank0]:     return Variable._execution_engine.run_backward(",
        "[rank0]: RuntimeError: [/__w/pytorch/third_party/gloo/unbound_buffer.cc:78] Timed out waiting 3000ms",
        "E1203 torchrun: ChildFailedError"])
    shown = _worker_traceback(output)
    assert "uneven.py" in shown and "model(x).backward()" in shown
    assert "graph.py" not in shown and "run_backward" not in shown and "1 frame inside torch left out" in shown
    assert shown.endswith("[rank0]: RuntimeError: Timed out waiting 3000ms")


def test_shorten_paths_names_the_environment_even_inside_the_course_folder(monkeypatch):
    from course_utils import distributed
    course_root = str(Path(distributed.__file__).resolve().parent.parent)
    monkeypatch.setattr(sys, "prefix", f"{course_root}/.venv")
    shown = distributed._shorten_paths(f"{course_root}/.venv/lib/x.py and {course_root}/notebooks/a.py")
    assert shown == "<env>/lib/x.py and notebooks/a.py"


def test_no_sync_leaves_one_allreduce_per_accumulated_step():
    with single_process_group():
        model = DistributedDataParallel(torch.nn.Linear(3, 1))
        calls = count_allreduces(model)
        for _ in range(3):
            with model.no_sync():
                model(torch.randn(2, 3)).sum().backward()
        assert calls == [0]
        model(torch.randn(2, 3)).sum().backward()
        assert calls == [1]
    assert not torch.distributed.is_initialized()       # destroyed on exit


def test_single_process_group_is_destroyed_on_error():
    with pytest.raises(ZeroDivisionError):
        with single_process_group():
            1 / 0
    assert not torch.distributed.is_initialized()


def test_free_port_can_be_bound_and_free_ports_differ():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", free_port()))
    ports = free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_the_traceback_shown_is_the_cause_not_a_peer_noticing_it():
    from course_utils.distributed import _worker_traceback
    output = "\n".join([
        "[rank1]: Traceback (most recent call last):",
        '[rank1]:   File "train.py", line 19, in <module>',
        "[rank1]:     dist.barrier()",
        "[rank1]: RuntimeError: [pair.cc:561] Connection closed by peer [127.0.0.1]:48817. This is typically "
        "caused by a remote worker crashing.",
        "[rank0]: Traceback (most recent call last):",
        '[rank0]:   File "train.py", line 17, in <module>',
        "[rank0]:     dist.monitored_barrier(timeout=timeout)",
        "[rank0]: RuntimeError: Rank 1 failed to pass monitoredBarrier in 2000 ms",
    ])
    shown = _worker_traceback(output)
    assert "Rank 1 failed to pass monitoredBarrier" in shown and "Connection closed" not in shown
    only_symptom = output.split("\n[rank0]")[0]
    assert "Connection closed by peer" in _worker_traceback(only_symptom)      # nothing better: show it
    summary = "Root Cause (first observed failure):\n[0]:\n  exitcode  : -9 (pid: 17834)  (SIGKILL)"
    assert _worker_traceback(f"{only_symptom}\n{summary}").endswith(f"torchrun's last words:\n{summary}")
    assert "Root Cause" not in _worker_traceback(f"{output}\n{summary}")     # a real cause needs no summary
