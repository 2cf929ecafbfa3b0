"""Chapter 3 exercises (debugging): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those.
"""
from course_utils.devices import check_mean_kept_output
from course_utils.memory import check_validation_losses
from course_utils.numerics import check_rms_normalise, check_sensor_dataset

__all__ = ['check_mean_kept_output', 'check_rms_normalise', 'check_sensor_dataset', 'check_validation_losses']
