"""Chapter 6: benchmark, precision choice, torch.compile helpers, ONNX export and verification."""
import numpy as np
import onnx
import pytest
import torch
from torch import nn

from course_utils import inference
from course_utils.inference import (benchmark, choose_autocast, count_compilations, export_onnx, try_compile,
                                    verify_onnx, watch_compiles)
from course_utils.timing import SpeedComparison
from course_utils.models import mlp


@pytest.fixture
def model():
    return mlp([16, 32, 4]).eval()


def test_benchmark_times_the_variants_interleaved_with_their_first_call_apart():
    import time
    order, slow_first = [], {"calls": 0}

    def fast(x):
        order.append("fast")
        return x + 1

    def slow(x):
        order.append("slow")
        slow_first["calls"] += 1
        if slow_first["calls"] == 1:
            time.sleep(0.05)              # a "compile" on the first call only
        time.sleep(0.002)
        return x + 1
    result = benchmark({"fast": fast, "slow": slow}, torch.ones(3), blocks=5, block_s=0.01)
    assert isinstance(result, SpeedComparison) and list(result.variants) == ["fast", "slow"]
    assert len(result["fast"].block_s) == len(result["slow"].block_s) == 5
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches >= 5                  # round-robin: the variants alternate, not one run after the other
    assert result["slow"].first_call_s >= 0.05 > result["slow"].median_s
    assert result.outcome("slow") == "slower" and "slower (spreads apart)" in result.verdict("slow")
    assert result.num_threads == torch.get_num_threads()
    with pytest.raises(ValueError, match="empty"):
        benchmark({})
    with pytest.raises(TypeError, match="fns must be a dict"):
        benchmark(fast)


def test_watch_compiles_counts_graphs_and_names_the_guard_that_failed(model):
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        compiled(torch.randn(3, 16))
        with watch_compiles() as same:
            compiled(torch.randn(3, 16))
    with watch_compiles() as grad_mode:
        compiled(torch.randn(3, 16))              # grad enabled now: Dynamo guards on the grad mode
    torch._dynamo.reset()
    assert same.graphs == 0 and same.recompiles == []
    assert grad_mode.graphs == 1 and len(grad_mode.recompiles) == 1
    assert any("grad_mode" in reason for reason in grad_mode.reasons)
    assert "1 graph(s) compiled" in str(grad_mode) and "recompiled because" in str(grad_mode)


def test_watch_compiles_restores_torch_logging():
    from torch._logging import _internal
    before = _internal.log_state.is_artifact_enabled("recompiles")
    with watch_compiles():
        assert _internal.log_state.is_artifact_enabled("recompiles")
    assert _internal.log_state.is_artifact_enabled("recompiles") == before


def test_choose_autocast_on_cpu_is_bfloat16_and_runs():
    choice = choose_autocast("cpu")
    assert choice.dtype == torch.bfloat16 and not choice.use_grad_scaler
    with choice.autocast():
        assert nn.Linear(4, 4)(torch.randn(2, 4)).dtype == torch.bfloat16
    with pytest.raises(ValueError):
        choose_autocast("meta")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_choose_autocast_on_cuda_follows_compute_capability():
    choice = choose_autocast("cuda")
    native_bf16 = torch.cuda.get_device_capability()[0] >= 8
    assert (choice.dtype == torch.bfloat16) == native_bf16 and choice.use_grad_scaler == (not native_bf16)


def test_try_compile_compiles_and_matches_eager(model):
    x = torch.randn(3, 16)
    result = try_compile(model, x, backend="eager")
    assert result.compiled and result.compile_s > 0
    torch.testing.assert_close(result(x), model(x))
    torch._dynamo.reset()


def test_try_compile_falls_back_without_a_compiler(model, monkeypatch):
    monkeypatch.setattr(inference, "cpp_compiler", lambda: None)
    result = try_compile(model, torch.randn(3, 16))
    assert not result.compiled and "no C++ compiler" in str(result)
    assert result.fn is model


def test_try_compile_falls_back_when_compilation_fails(model):
    def broken_backend(gm, example_inputs):
        raise RuntimeError("backend exploded")
    result = try_compile(model, torch.randn(3, 16), backend=broken_backend)
    assert not result.compiled and "backend exploded" in result.reason
    torch._dynamo.reset()


def test_count_compilations_static_versus_dynamic(model):
    inputs = [torch.randn(n, 16) for n in (2, 4, 8, 16)]
    assert count_compilations(model, inputs, dynamic=False) == 4
    assert count_compilations(model, inputs, dynamic=True) == 1


def test_dynamic_export_verifies_at_several_batch_sizes(model, tmp_path):
    path = export_onnx(model, (torch.randn(2, 16),), tmp_path / "m.onnx")
    assert path.exists() and not list(tmp_path.glob("*.data"))          # weights embedded
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_param   # symbolic batch
    result = verify_onnx(model, path, [(torch.randn(n, 16),) for n in (1, 4, 32)])
    assert result.passed and result.max_abs_error < 1e-4 and len(result.rows) == 3
    assert model.training is False


def test_static_export_fails_at_batch_4_naming_the_shape(model, tmp_path):
    path = export_onnx(model, (torch.randn(2, 16),), tmp_path / "static.onnx", dynamic_batch=False)
    result = verify_onnx(model, path, [(torch.randn(2, 16),), (torch.randn(4, 16),)])
    assert not result.passed
    assert result.rows[0].passed and not result.rows[1].passed
    assert "[4, 16]" in result.rows[1].error
    assert "FAIL" in str(result)


def test_a_model_that_differs_from_the_file_fails_verification(model, tmp_path):
    path = export_onnx(model, (torch.randn(2, 16),), tmp_path / "m.onnx")
    changed = mlp([16, 32, 4]).eval()        # "a custom op replaced": other weights, same interface
    result = verify_onnx(changed, path, [(torch.randn(4, 16),)])
    assert not result.passed and result.max_abs_error > 1e-3


def test_a_batch_1_example_exports_a_dynamic_batch_axis(model, tmp_path):
    """torch 2.13 keeps a Dim on a size-1 example dynamic: what most people pass is accepted."""
    path = export_onnx(model, (torch.randn(1, 16),), tmp_path / "one.onnx")
    assert onnx.load(str(path)).graph.input[0].type.tensor_type.shape.dim[0].dim_param
    assert verify_onnx(model, path, [(torch.randn(n, 16),) for n in (1, 7, 64)]).passed


class ShapeBranch(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return self.body(x).softmax(-1) if x.shape[0] > 10 else self.body(x)


def test_a_branch_on_the_batch_size_is_refused_at_export_not_baked_in(model, tmp_path):
    branched = ShapeBranch(model).eval()
    plain = tmp_path / "plain.onnx"                    # what the exporter alone does: no error, one branch
    torch.onnx.export(branched, (torch.randn(2, 16),), str(plain), input_names=["input"], dynamo=True,
                      dynamic_shapes=({0: torch.export.Dim("batch")},), external_data=False, verbose=False)
    result = verify_onnx(branched, plain, [(torch.randn(n, 16),) for n in (2, 8, 11, 64)])
    assert [row.passed for row in result.rows] == [True, True, False, False]
    with pytest.raises(ValueError, match="only valid for batch sizes from 0 to 10"):
        export_onnx(branched, (torch.randn(2, 16),), tmp_path / "refused.onnx")
    assert not (tmp_path / "refused.onnx").exists()


def test_export_restores_training_mode_and_rejects_bad_examples(tmp_path):
    model = mlp([16, 4], dropout=0.5).train()
    export_onnx(model, (torch.randn(2, 16),), tmp_path / "m.onnx")
    assert model.training
    with pytest.raises(TypeError, match="tuple of tensors"):
        export_onnx(model, torch.randn(2, 16), tmp_path / "t.onnx")
    with pytest.raises(ValueError, match="inputs_list is empty"):
        verify_onnx(model, tmp_path / "m.onnx", [])


def test_a_compiled_model_called_like_eager_does_not_recompile(model):
    """try_compile's first call and the timed calls share one grad mode (inference_mode): one graph."""
    from torch._dynamo.testing import CompileCounter
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = try_compile(model, torch.randn(3, 16), backend=counter)
    x = torch.randn(3, 16)                     # made outside inference_mode, like the benchmark's inputs
    with torch.inference_mode():
        compiled(x)
    assert compiled.compiled and counter.frame_count == 1
    torch._dynamo.reset()


def test_verify_onnx_reports_rejected_inputs_on_one_line_without_inf(model, tmp_path):
    path = export_onnx(model, (torch.randn(2, 16),), tmp_path / "static.onnx", dynamic_batch=False)
    result = verify_onnx(model, path, [(torch.randn(2, 16),), (torch.randn(4, 16),)])
    text = str(result)
    assert not result.passed and "inf" not in text and "1 of 2 input(s) rejected" in text
    assert "Please fix" not in text and "[ONNXRuntimeError]" not in text and "Got invalid dimensions" in text


class PerRow(nn.Module):
    def __init__(self, body):
        super().__init__()
        self.body = body

    def forward(self, x):
        return torch.stack([self.body(row) for row in x])     # a Python loop over the batch


def test_a_loop_over_the_batch_is_refused_not_exported_static(model, tmp_path):
    per_row = PerRow(model).eval()
    plain = tmp_path / "plain.onnx"                    # what the exporter alone does: a file fixed at batch 3
    torch.onnx.export(per_row, (torch.randn(3, 16),), str(plain), input_names=["input"], dynamo=True,
                      dynamic_shapes=({0: torch.export.Dim("batch")},), external_data=False, verbose=False)
    assert onnx.load(str(plain)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 3
    with pytest.raises(ValueError, match=r"fixes the batch size \(input: \[3, 16\]\)"):
        export_onnx(per_row, (torch.randn(3, 16),), tmp_path / "refused.onnx")
    assert not (tmp_path / "refused.onnx").exists()
    assert export_onnx(per_row, (torch.randn(3, 16),), tmp_path / "static.onnx", dynamic_batch=False).exists()


def test_watch_compiles_keeps_the_levels_set_on_torch_loggers():
    import logging
    logger = logging.getLogger("torch.onnx")
    before = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with watch_compiles():
            pass
        assert logger.level == logging.ERROR
    finally:
        logger.setLevel(before)
