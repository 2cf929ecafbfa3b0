"""Settings shared by the unit tests and the notebooks that nbval executes.

COURSE_SOLUTIONS=1 is set before any notebook kernel starts (kernels inherit the environment),
so the exercises run with their reference solutions in place (see course_utils.exercises).
"""
import os

os.environ.setdefault("COURSE_SOLUTIONS", "1")
