"""Chapter 1 exercises (tensors and autograd): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those.
"""
from course_utils.autograd import check_fit_line_by_hand, check_grad_of_cube, check_line_parameters, check_sgd_update, check_two_branch_forward

__all__ = ['check_fit_line_by_hand', 'check_grad_of_cube', 'check_line_parameters', 'check_sgd_update', 'check_two_branch_forward']
