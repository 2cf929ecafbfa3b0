"""course_utils: the diagnostic and training helpers of the PyTorch Field Guide.

One module per topic; every public name is re-exported here, so `from course_utils import NAME`
works for all of them.
"""
from course_utils.autograd import LineFit, check_grad_of_cube, check_sgd_update, fit_line
from course_utils.devices import get_device, to_device
from course_utils.environment import DoctorReport, doctor, hardware_summary
from course_utils.exercises import exercise, solutions_in_place
from course_utils.pitfalls import expect_error, expect_warning
from course_utils.plotting import plot_line_fit, plot_losses
from course_utils.rng import seed_everything
from course_utils.widgets import RegressionExplorer

__all__ = [
    "DoctorReport", "LineFit", "RegressionExplorer", "check_grad_of_cube", "check_sgd_update", "doctor", "exercise",
    "expect_error", "expect_warning", "fit_line", "get_device", "hardware_summary",
    "plot_line_fit", "plot_losses", "seed_everything", "solutions_in_place", "to_device",
]

