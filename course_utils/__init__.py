"""course_utils: the diagnostic and training helpers of the PyTorch Field Guide.

One module per topic; every public name is re-exported here, so `from course_utils import NAME`
works for all of them. The exercise checks (course scaffolding, not tools) live in
`course_utils.exercises`, one module per chapter (and one for the triage page), and are re-exported here too.
"""
from course_utils.autograd import LineFit, fit_line
from course_utils.broken_project import StageReport, check_distributed, check_export, check_resume, check_training
from course_utils.checkpoints import (CheckpointError, LoadReport, load_checkpoint, load_matching_state_dict,
                                      remove_stale_partials, save_checkpoint, saved_as_if_on)
from course_utils.data import LoaderStats, SyntheticImages, benchmark_loader, compare_pinned_copy
from course_utils.devices import DeviceMismatchError, check_devices, get_device, named_tensors, to_device, torch_threads
from course_utils.diagnose import Diagnosis, diagnose
from course_utils.diagnosis_rules import Finding
from course_utils.distributed import (TorchrunFailed, TorchrunResult, count_allreduces, free_port, free_ports,
                                      global_batch_size, is_main_process, launch_torchrun, rank_zero_only,
                                      script_variant, seed_for_rank, shard_indices, single_process_group,
                                      still_running, worker_pids)
from course_utils.environment import DoctorReport, cpp_compiler, doctor, hardware_summary, idle_cores
from course_utils.exercises import Progress, Verdict, exercise, progress, solutions_in_place
from course_utils.exercises.broken_project import *  # noqa: F403  (check_* of chapter 7)
from course_utils.exercises.checkpointing import *  # noqa: F403  (check_* of chapter 4)
from course_utils.exercises.data_and_modules import *  # noqa: F403  (check_* of chapter 2)
from course_utils.exercises.ddp_torchrun import *  # noqa: F403  (check_* of chapter 5)
from course_utils.exercises.debugging import *  # noqa: F403  (check_* of chapter 3)
from course_utils.exercises.inference import *  # noqa: F403  (check_* of chapter 6)
from course_utils.exercises.tensors_autograd import *  # noqa: F403  (check_* of chapter 1)
from course_utils.exercises.triage import *  # noqa: F403  (check_* of the triage page's drills)
from course_utils.explain import Explanation, explain, load_ipython_extension, unload_ipython_extension
from course_utils.inference import (CompiledModel, CompileWatch, OnnxVerification, PrecisionChoice, benchmark,
                                    choose_autocast, count_compilations, export_onnx, onnx_session, try_compile,
                                    verify_onnx, watch_compiles)
from course_utils.memory import (EstimateCheck, MemoryEstimate, MemoryReport, check_memory_estimate, cpu_memory_cap,
                                 cuda_memory_cap, estimate_training_memory, find_max_batch_size, measure_peak_memory,
                                 saved_activation_bytes)
from course_utils.memory_simulation import (SimulatedStep, SimulationError, max_batch_size_by_simulation,
                                            simulate_training_step)
from course_utils.models import SmallConvNet, TransformerBlock, mlp
from course_utils.modules import find_unregistered_modules, snapshot, unchanged
from course_utils.numerics import NonFinite, NonFiniteLocation, find_nonfinite, locate_nonfinite
from course_utils.pitfalls import capture_process_output, expect_error, expect_warning
from course_utils.plotting import plot_line_fit, plot_losses
from course_utils.resume import ResumeProbe, ResumeReport, check_resume
from course_utils.rng import capture_rng_state, restore_rng_state, seed_everything
from course_utils.timing import SpeedComparison, VariantTiming, compare_speed
from course_utils.training import History, evaluate, fit, train_accumulated, train_step
from course_utils.widgets import RegressionExplorer

from types import ModuleType as _ModuleType

__all__ = sorted(name for name, value in globals().items()
                 if not name.startswith("_") and not isinstance(value, _ModuleType))
