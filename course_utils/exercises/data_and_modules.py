"""Chapter 2 exercises (the DataLoader, nn.Module pitfalls and the training loop): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those.
"""
from course_utils.modules import check_build_normalised_mlp
from course_utils.training import check_accumulate_step, check_predict_batches, check_train_loop

__all__ = ['check_accumulate_step', 'check_build_normalised_mlp', 'check_predict_batches', 'check_train_loop']
