"""course_utils: the diagnostic and training helpers of the PyTorch Field Guide.

One module per topic; every public name is re-exported here, so `from course_utils import NAME`
works for all of them.
"""
from course_utils.autograd import (LineFit, check_fit_line_by_hand, check_grad_of_cube, check_line_parameters,
                                   check_sgd_update, check_two_branch_forward, fit_line)
from course_utils.checkpoints import (CheckpointError, LoadReport, check_checkpoint_dict, check_epoch_batches_from,
                                      check_load_matching, check_resume_training, load_checkpoint,
                                      load_matching_state_dict, remove_stale_partials, save_checkpoint, saved_as_if_on)
from course_utils.data import LoaderStats, SyntheticImages, benchmark_loader, compare_pinned_copy
from course_utils.devices import (DeviceMismatchError, check_devices, check_mean_kept_output, get_device,
                                  named_tensors, to_device, torch_threads)
from course_utils.distributed import (TorchrunFailed, TorchrunResult, check_accumulate_no_sync, check_epoch_shards,
                                      check_eval_shard, check_save_checkpoint_once, count_allreduces, free_port,
                                      free_ports, global_batch_size, is_main_process, launch_torchrun, rank_zero_only,
                                      script_variant, seed_for_rank, shard_indices, single_process_group,
                                      still_running, worker_pids)
from course_utils.environment import DoctorReport, cpp_compiler, doctor, hardware_summary, idle_cores
from course_utils.exercises import Progress, Verdict, exercise, progress, solutions_in_place
from course_utils.explain import Explanation, explain, load_ipython_extension, unload_ipython_extension
from course_utils.inference import (BenchmarkTable, CompiledModel, OnnxVerification, PrecisionChoice, benchmark,
                                    check_clipped_forward, check_count_graph_breaks, check_export_for_any_batch,
                                    check_onnx_matches_torch, choose_autocast, count_compilations, export_onnx,
                                    onnx_session, try_compile, verify_onnx)
from course_utils.memory import (EstimateCheck, MemoryEstimate, MemoryReport, check_memory_estimate,
                                 check_validation_losses, cpu_memory_cap, cuda_memory_cap, estimate_training_memory,
                                 find_max_batch_size, measure_peak_memory, saved_activation_bytes)
from course_utils.memory_simulation import (SimulatedStep, SimulationError, max_batch_size_by_simulation,
                                            simulate_training_step)
from course_utils.models import SmallConvNet, TransformerBlock, mlp
from course_utils.modules import check_build_normalised_mlp, find_unregistered_modules, snapshot, unchanged
from course_utils.numerics import (NonFinite, NonFiniteLocation, check_rms_normalise, check_sensor_dataset,
                                   find_nonfinite, locate_nonfinite)
from course_utils.pitfalls import capture_process_stderr, expect_error, expect_warning
from course_utils.plotting import plot_line_fit, plot_losses
from course_utils.resume import ResumeProbe, ResumeReport, check_resume
from course_utils.rng import capture_rng_state, restore_rng_state, seed_everything
from course_utils.training import (History, check_accumulate_step, check_predict_batches, check_train_loop,
                                   evaluate, fit, train_accumulated, train_step)
from course_utils.widgets import RegressionExplorer

from types import ModuleType as _ModuleType

__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not isinstance(value, _ModuleType))
