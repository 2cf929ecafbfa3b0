"""Chapter 6: benchmark, precision choice, torch.compile helpers, ONNX export and verification."""
import numpy as np
import onnx
import pytest
import torch
from torch import nn

from course_utils import (check_clipped_forward, check_count_graph_breaks, check_export_for_any_batch,
                          check_onnx_matches_torch, inference)
from course_utils.exercises import reference
from course_utils.inference import (benchmark, choose_autocast, count_compilations, export_onnx, try_compile,
                                    verify_onnx)
from course_utils.models import mlp


@pytest.fixture
def model():
    return mlp([16, 32, 4]).eval()


def test_benchmark_table_orders_speedups_and_measures_first_call():
    import time
    slow_first = {"calls": 0}

    def fast(x):
        return x + 1

    def slow(x):
        slow_first["calls"] += 1
        if slow_first["calls"] == 1:
            time.sleep(0.05)              # a "compile" on the first call only
        time.sleep(0.002)
        return x + 1
    table = benchmark({"fast": fast, "slow": slow}, torch.ones(3), min_run_time=0.05)
    assert [r.name for r in table.rows] == ["fast", "slow"]
    assert table["fast"].speedup == 1.0 and table["slow"].speedup < 0.5
    assert table["slow"].first_call_s >= 0.05 > table["slow"].median_s
    assert table.num_threads == torch.get_num_threads()
    assert "speed-up" in str(table) and "torch.utils.benchmark" in str(table)
    assert len(table.plot().patches) == 2
    with pytest.raises(ValueError, match="empty"):
        benchmark({})


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


def test_benchmark_verdict_says_no_significant_difference_within_the_iqr():
    rows = [inference.BenchmarkRow("eager", 0.1, 1.00e-3, 0.10e-3, 1.0),
            inference.BenchmarkRow("close", 0.1, 0.95e-3, 0.08e-3, 1.05),
            inference.BenchmarkRow("fast", 0.1, 0.50e-3, 0.05e-3, 2.0),
            inference.BenchmarkRow("slow", 0.1, 2.00e-3, 0.10e-3, 0.5)]
    table = inference.BenchmarkTable(rows, "test", 1)
    assert table.verdict("close").startswith("no significant difference")
    assert table.verdict("fast") == "2.00x faster" and table.verdict("slow") == "0.50x the speed (slower)"
    assert table.verdict("eager", baseline="fast") == "0.50x the speed (slower)"


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


# --- exercises: the reference passes; each planted bug, left alone, is rejected ------------

def _export(model, path, dim=0, external_data=False):
    torch.onnx.export(model, (torch.randn(4, 8),), path, input_names=["input"], output_names=["output"],
                      dynamic_shapes=({dim: torch.export.Dim("batch")},), dynamo=True, external_data=external_data)


def test_export_for_any_batch_rejects_each_planted_bug(learner):
    assert check_export_for_any_batch(reference("export_for_any_batch"))
    batch_baked_in = check_export_for_any_batch(lambda model, path: _export(model, path, dim=1))
    assert not batch_baked_in and "rejected a batch of 1" in str(batch_baked_in)
    weights_apart = check_export_for_any_batch(lambda model, path: _export(model, path, external_data=True))
    assert not weights_apart and "it looked for model.onnx.data" in str(weights_apart)
    assert "not attempted" in str(check_export_for_any_batch(lambda model, path: None))


def _matches(batch_sizes, atol):
    def onnx_matches_torch(model, path):
        import onnxruntime as ort
        session = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        for n in batch_sizes:
            x = torch.randn(n, 8)
            got = session.run(None, {"input": x.numpy()})[0]
            with torch.no_grad():
                want = model(x)
            if not np.allclose(got, want.numpy(), rtol=1e-3, atol=atol):
                return False
        return True
    return onnx_matches_torch


def test_onnx_matches_torch_rejects_each_planted_bug(learner):
    assert check_onnx_matches_torch(reference("onnx_matches_torch"))
    two_sizes = check_onnx_matches_torch(_matches((2, 8), atol=1e-4))
    assert not two_sizes and "differ from its model's at some batch sizes" in str(two_sizes)
    loose = check_onnx_matches_torch(_matches(range(1, 65), atol=1e-1))
    assert not loose and "0.01 off" in str(loose)
    assert "not attempted" in str(check_onnx_matches_torch(lambda model, path: None))


def test_clipped_forward_rejects_each_planted_bug(learner):
    assert check_clipped_forward(reference("clipped_forward"))

    def with_if(layer, x):
        h = layer(x)
        limit = 3 * h.std()
        if (h.abs() > limit).any():
            h = h.clamp(-limit, limit)
        return h

    def with_print(layer, x):
        h = layer(x)
        limit = 3 * h.std()
        print("clipping")
        return torch.clamp(h, -limit, limit)

    def without_clipping(layer, x):
        return layer(x)
    for buggy in (with_if, with_print):
        verdict = check_clipped_forward(buggy)
        assert not verdict and "fullgraph=True) refused it" in str(verdict)
    assert "differ from clipping" in str(check_clipped_forward(without_clipping))


def test_count_graph_breaks_rejects_each_planted_bug(learner):
    assert check_count_graph_breaks(reference("count_graph_breaks"))

    def counting_graphs(model, x):
        explanation = torch._dynamo.explain(model)(x)
        return explanation.graph_count, [reason.user_stack[-1].line for reason in explanation.break_reasons]

    def outermost_frame(model, x):
        explanation = torch._dynamo.explain(model)(x)
        return explanation.graph_break_count, [reason.user_stack[0].line for reason in explanation.break_reasons]
    graphs = check_count_graph_breaks(counting_graphs)
    assert not graphs and "with 2 graph breaks it returned the count 3" in str(graphs)
    outer = check_count_graph_breaks(outermost_frame)
    assert not outer and "`x = _announce(x)` is not a line Dynamo failed to trace" in str(outer)
    assert "not attempted" in str(check_count_graph_breaks(lambda model, x: None))


def test_clipped_forward_names_the_line_that_broke_the_graph(learner):
    def with_print(layer, x):
        h = layer(x)
        limit = 3 * h.std()
        print("clipping")
        return torch.clamp(h, -limit, limit)
    assert 'at `print("clipping")`' in str(check_clipped_forward(with_print))


def test_benchmark_verdict_refuses_to_rank_noisy_timings():
    rows = [inference.BenchmarkRow("eager", 0.1, 0.48e-3, 0.05e-3, 1.0),
            inference.BenchmarkRow("noisy", 0.1, 24e-3, 30e-3, 0.02),
            inference.BenchmarkRow("spread", 0.1, 1.2e-3, 1.0e-3, 0.4),
            inference.BenchmarkRow("spread but far", 0.1, 4.8e-3, 3.0e-3, 0.1)]
    table = inference.BenchmarkTable(rows, "test", 1)
    assert table.verdict("noisy").startswith("too noisy to tell") and "IQR of noisy is larger" in table.verdict("noisy")
    assert table.verdict("spread").startswith("too noisy to tell (0.40x, but the gap is within the IQR")
    assert table.verdict("spread but far") == "0.10x the speed (slower)"   # a gap beyond the IQR still ranks
    few = inference.BenchmarkTable([inference.BenchmarkRow("eager", 0.1, 150e-3, 0.0, 1.0, blocks=2),
                                    inference.BenchmarkRow("compiled", 0.1, 50e-3, 0.0, 3.0, blocks=2)], "test", 1)
    assert few.verdict("compiled").startswith("too noisy to tell (3.00x, but eager and compiled ran fewer than 5")


def test_verify_onnx_reports_rejected_inputs_on_one_line_without_inf(model, tmp_path):
    path = export_onnx(model, (torch.randn(2, 16),), tmp_path / "static.onnx", dynamic_batch=False)
    result = verify_onnx(model, path, [(torch.randn(2, 16),), (torch.randn(4, 16),)])
    text = str(result)
    assert not result.passed and "inf" not in text and "1 of 2 input(s) rejected" in text
    assert "Please fix" not in text and "[ONNXRuntimeError]" not in text and "Got invalid dimensions" in text
