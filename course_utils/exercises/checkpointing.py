"""Chapter 4 exercises (checkpoints): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those.
"""
from course_utils.checkpoints import check_checkpoint_dict, check_epoch_batches_from, check_load_matching, check_resume_training

__all__ = ['check_checkpoint_dict', 'check_epoch_batches_from', 'check_load_matching', 'check_resume_training']
