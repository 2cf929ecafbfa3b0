"""Chapter 3: saved activations, the training-memory estimate, the peak measurement, batch search."""
import sys

import pytest
import torch
from torch import nn

from course_utils.memory import (check_memory_estimate, cpu_memory_cap,
                                 estimate_training_memory, find_max_batch_size, measure_peak_memory,
                                 saved_activation_bytes)
from course_utils.models import SmallConvNet, TransformerBlock, mlp


def test_saved_activation_bytes_dedups_shared_storage_and_skips_excluded():
    x = torch.randn(10, 10, requires_grad=True)

    def fn():
        y = x * 2            # saves nothing of size (mul by a scalar)
        z = y * y            # saves y twice: counted once
        return z.view(-1) * y.view(-1)   # saves views of z and y: same storages
    counted, _ = saved_activation_bytes(fn)
    assert counted == 2 * 400  # y and z, 400 bytes each
    counted, _ = saved_activation_bytes(lambda: x * x, exclude=[x])
    assert counted == 0


def test_saved_activation_bytes_is_zero_without_grad():
    model = mlp([8, 8, 1])
    with torch.no_grad():
        counted, out = saved_activation_bytes(model, torch.randn(4, 8))
    assert counted == 0 and out.shape == (4, 1)


def test_estimate_counts_parameters_gradients_and_optimizer_state():
    model = mlp([10, 20, 5])   # 10*20+20 + 20*5+5 = 325 parameters
    x = torch.randn(4, 10)
    for optimizer, factor in [("sgd", 0), ("sgd_momentum", 1), ("adam", 2), ("adamw", 2)]:
        est = estimate_training_memory(model, x, optimizer=optimizer)
        assert est.parameters == est.gradients == 325 * 4
        extra = 4 * 4 if optimizer.startswith("adam") else 0
        assert est.optimizer_state == factor * 325 * 4 + extra
        assert est.total == est.parameters + est.gradients + est.optimizer_state + est.activations
    half = estimate_training_memory(model, x, dtype=torch.float16)
    assert half.parameters == 325 * 2


def test_estimated_activations_match_the_real_saved_tensors_and_scale_with_batch():
    model = SmallConvNet()
    params = list(model.parameters())
    for n in (2, 8):
        real, _ = saved_activation_bytes(model, torch.randn(n, 3, 16, 16), exclude=params)
        est = estimate_training_memory(model, torch.randn(n, 3, 16, 16))
        assert est.activations == real
    small = estimate_training_memory(model, torch.empty(4, 3, 16, 16, device="meta")).activations
    large = estimate_training_memory(model, torch.empty(16, 3, 16, 16, device="meta")).activations
    assert large == pytest.approx(4 * small, rel=0.01)


def test_estimate_frozen_parameters_have_no_gradients_and_mode_is_restored():
    model = mlp([10, 20, 5]).eval()
    model[0].requires_grad_(False)
    est = estimate_training_memory(model, torch.randn(2, 10))
    assert est.gradients == (20 * 5 + 5) * 4
    assert not model.training


def test_estimate_bad_arguments():
    with pytest.raises(ValueError, match="optimizer must be one of"):
        estimate_training_memory(mlp([2, 2]), torch.randn(1, 2), optimizer="lion")
    with pytest.raises(TypeError, match="tensor batch"):
        estimate_training_memory(mlp([2, 2]), [1, 2])


def test_measure_peak_memory_on_cpu_counts_live_tensors():
    def allocate():
        a = torch.empty(1_000_000)       # 4 MB, freed at the end
        b = torch.empty(500_000)         # 2 MB
        del a
        c = torch.empty(250_000)         # 1 MB, returned
        del b
        return c
    report = measure_peak_memory(allocate, device="cpu")
    assert report.peak_bytes == 6_000_000
    assert report.result.numel() == 250_000 and report.device.type == "cpu"


def test_measure_peak_memory_ignores_views_and_in_place():
    x = torch.randn(1000, 1000)
    report = measure_peak_memory(lambda: x.view(-1).add_(1).t(), device="cpu")
    assert report.peak_bytes == 0


def test_measure_peak_memory_rejects_other_devices():
    with pytest.raises(ValueError, match="cuda and cpu"):
        measure_peak_memory(lambda: None, device="meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_measure_peak_memory_on_cuda():
    report = measure_peak_memory(lambda: torch.empty(2**20, device="cuda").sum(), device="cuda")
    assert report.peak_bytes >= 4 * 2**20


def test_check_memory_estimate_simulation_within_5_percent_parts_within_tolerance():
    check = check_memory_estimate(SmallConvNet(), (3, 16, 16), [4, 16], optimizer="sgd")
    assert len(check.rows) == 2
    assert check.worst_relative_error <= 0.05, str(check)
    assert all(0.8 <= r <= 1.5 for r in check.parts_ratios), str(check)
    assert check.worst_relative_error == max(abs(r - 1) for r in check.ratios)
    assert "meas/sim" in str(check)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("make_model, shape", [(lambda: mlp([512, 1024, 1024, 10]), (512,)),
                                               (lambda: TransformerBlock(128, 4), (64, 128))])
def test_the_simulated_peak_matches_cuda_max_memory_allocated(make_model, shape):
    """The GPU runner's check of the simulation: against the caching allocator's own peak counter."""
    check = check_memory_estimate(make_model().cuda(), shape, [16, 64], optimizer="adam")
    assert check.worst_relative_error <= 0.05, str(check)


def test_find_max_batch_size_against_a_budget():
    bytes_per_sample = 40_000

    def step(n):
        return torch.empty(n * bytes_per_sample // 4).fill_(1).sum()
    found = find_max_batch_size(step, limit=1000, budget_bytes=100 * bytes_per_sample + 100, margin=0.0)
    assert found == 100
    assert find_max_batch_size(step, limit=1000, budget_bytes=100 * bytes_per_sample + 100) == 90  # 10 % margin
    assert find_max_batch_size(step, limit=50, budget_bytes=100 * bytes_per_sample, margin=0) == 50


def _simulate_cuda_counters_that_see_nothing(monkeypatch):
    """A CUDA machine as measure_peak_memory sees it, whose counters never see a CPU step."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    for name in ("synchronize", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: None)
    for name in ("memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, lambda *args, **kwargs: 0)


def test_a_budget_is_measured_on_the_cpu_even_where_cuda_exists(monkeypatch):
    bytes_per_sample = 40_000

    def cpu_step(n):
        return torch.empty(n * bytes_per_sample // 4).fill_(1).sum()
    _simulate_cuda_counters_that_see_nothing(monkeypatch)
    assert find_max_batch_size(cpu_step, limit=1000, budget_bytes=100 * bytes_per_sample + 100, margin=0) == 100
    with pytest.raises(RuntimeError, match="allocated nothing on cuda"):
        find_max_batch_size(cpu_step, limit=1000, budget_bytes=100 * bytes_per_sample, device="cuda")


def test_oom_in_disguise_counts_as_out_of_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)

    def step(n):
        if n > 40:
            raise RuntimeError("cuDNN error: CUDNN_BACKEND_EXECUTION_PLAN: unable to find an engine to execute this computation")
        if n == 37:
            raise RuntimeError("an unrelated bug")
    assert find_max_batch_size(step, start=1, limit=64, margin=0) == 40
    with pytest.raises(RuntimeError, match="unrelated bug"):
        find_max_batch_size(step, start=37, limit=64, margin=0)


def test_the_estimate_check_warms_up_lazy_workspaces_before_measuring():
    class LazyWorkspace(nn.Module):
        """Keeps an 8 MiB scratch buffer from its first real call on, as cuBLAS keeps its workspace
        (a meta-device forward pass, which the estimate runs, launches no kernel and allocates none)."""

        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(8, 8)
            self.workspace = None

        def forward(self, x):
            if self.workspace is None and x.device.type != "meta":
                self.workspace = torch.empty(2**21)
            return self.linear(x)
    check = check_memory_estimate(LazyWorkspace(), (8,), [4, 8], optimizer="sgd")
    assert max(measured for *_, measured in check.rows) < 2**20, str(check)


def test_find_max_batch_size_errors():
    with pytest.raises(RuntimeError, match="even batch size 1"):
        find_max_batch_size(lambda n: torch.empty(1000).fill_(0), limit=4, budget_bytes=10)
    with pytest.raises(ValueError, match="start <= limit"):
        find_max_batch_size(lambda n: None, start=5, limit=4, budget_bytes=10)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="pass budget_bytes"):
            find_max_batch_size(lambda n: None, limit=4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_find_max_batch_size_catches_real_cuda_oom():
    total = torch.cuda.get_device_properties(0).total_memory
    per_sample = total // 1000

    def step(n):
        return torch.empty(n * per_sample, dtype=torch.uint8, device="cuda").fill_(1)
    found = find_max_batch_size(step, limit=10_000, margin=0)
    assert 1 <= found < 1000


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_cuda_memory_cap_needs_cuda():
    from course_utils.memory import cuda_memory_cap
    with pytest.raises(RuntimeError, match="budget_bytes"):
        with cuda_memory_cap(0.5):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_memory_cap_causes_a_real_oom_and_is_lifted():
    from course_utils.memory import cuda_memory_cap
    total = torch.cuda.get_device_properties(0).total_memory
    with cuda_memory_cap(0.05) as cap:
        assert cap < total
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(int(0.2 * total), dtype=torch.uint8, device="cuda")
    x = torch.empty(int(0.1 * total), dtype=torch.uint8, device="cuda")  # allowed again
    del x


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS is enforced on Linux only")
def test_cpu_memory_cap_causes_a_real_allocator_error_and_is_lifted():
    import resource
    before = resource.getrlimit(resource.RLIMIT_AS)
    with cpu_memory_cap(256 * 2**20) as cap:
        assert resource.getrlimit(resource.RLIMIT_AS)[0] == cap
        with pytest.raises(RuntimeError, match="DefaultCPUAllocator: can't allocate memory"):
            torch.empty(2**30)                       # 4 GiB > 256 MiB of headroom
        torch.empty(2**20).fill_(1)                  # 4 MiB still fits
    assert resource.getrlimit(resource.RLIMIT_AS) == before
    with pytest.raises(ValueError, match="positive"):
        with cpu_memory_cap(0):
            pass
