"""Chapter 6 exercises (inference): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those.
"""
from course_utils.inference import check_clipped_forward, check_count_graph_breaks, check_export_for_any_batch, check_onnx_matches_torch

__all__ = ['check_clipped_forward', 'check_count_graph_breaks', 'check_export_for_any_batch', 'check_onnx_matches_torch']
