"""Chapter 2: the synthetic dataset and benchmark_loader."""
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from course_utils.data import LoaderStats, SyntheticImages, benchmark_loader, compare_pinned_copy


def test_synthetic_images_shapes_and_determinism():
    ds = SyntheticImages(n=10, size=16, classes=3, work=2)
    image, label = ds[4]
    assert image.shape == (3, 16, 16) and image.dtype == torch.float32
    assert label.dtype == torch.int64 and 0 <= label < 3
    torch.manual_seed(0)
    a = ds[4][0]
    torch.manual_seed(0)
    torch.testing.assert_close(ds[4][0], a)
    assert abs(a.mean().item()) < 1e-4  # normalised


def test_synthetic_images_rejects_bad_arguments_and_indices():
    with pytest.raises(ValueError, match="size >= 8"):
        SyntheticImages(size=2)
    with pytest.raises(IndexError, match="out of range"):
        SyntheticImages(n=3)[3]


def test_benchmark_loader_counts_batches_and_samples():
    loader = DataLoader(TensorDataset(torch.zeros(100, 2)), batch_size=10)
    stats = benchmark_loader(loader, warmup=2, label="demo")
    assert isinstance(stats, LoaderStats)
    assert stats.batches == 8 and stats.samples == 80
    assert stats.batches_per_s > 0 and stats.samples_per_s == pytest.approx(10 * stats.batches_per_s)
    assert stats.first_batch_s >= 0 and str(stats).startswith("demo:")


def test_benchmark_loader_warms_up_one_batch_per_worker():
    loader = DataLoader(TensorDataset(torch.zeros(100, 2)), batch_size=10, num_workers=2)
    assert benchmark_loader(loader).batches == 8                 # batches 1 and 2 (one per worker) not timed
    assert benchmark_loader(loader, warmup=1).batches == 9


def test_benchmark_loader_max_batches():
    loader = DataLoader(TensorDataset(torch.zeros(100, 2)), batch_size=10)
    assert benchmark_loader(loader, max_batches=3).batches == 3


def test_benchmark_loader_counts_dict_batches_and_short_last_batch():
    data = [{"x": torch.zeros(3)} for _ in range(25)]
    stats = benchmark_loader(DataLoader(data, batch_size=10))
    assert stats.samples == 15  # 10 + 5 after the warm-up batch


def test_benchmark_loader_bad_input():
    with pytest.raises(TypeError, match="DataLoader"):
        benchmark_loader([1, 2, 3])
    with pytest.raises(ValueError, match="no batch after"):
        benchmark_loader(DataLoader(TensorDataset(torch.zeros(0, 2)), batch_size=4))
    with pytest.raises(ValueError, match="warmup >= 1"):
        benchmark_loader(DataLoader(TensorDataset(torch.zeros(4, 2))), warmup=0)


@pytest.mark.slow
def test_workers_use_the_importable_dataset_with_spawn():
    loader = DataLoader(SyntheticImages(n=8, work=1), batch_size=4, num_workers=2,
                        multiprocessing_context="spawn")
    assert benchmark_loader(loader, warmup=1).samples == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only error")
def test_compare_pinned_copy_needs_cuda():
    with pytest.raises(RuntimeError, match="CUDA device"):
        compare_pinned_copy(1024, "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compare_pinned_copy_on_cuda():
    times = compare_pinned_copy(64 * 2**20, "cuda", min_run_time=0.1)
    assert set(times) == {"pageable", "pin_memory() then copy", "pinned", "pinned, non_blocking",
                          "non_blocking call returns after"}
    assert all(t > 0 for t in times.values())
    # the asynchronous call returns long before a synchronised copy of the same bytes has finished
    assert times["non_blocking call returns after"] < 0.5 * times["pinned, non_blocking"]
