"""Chapter 5 exercises (DDP and torchrun): the checks and their reference solutions.

Course scaffolding, not a tool a practitioner keeps: the topic modules hold those.
"""
from course_utils.distributed import check_accumulate_no_sync, check_epoch_shards, check_eval_shard, check_save_checkpoint_once

__all__ = ['check_accumulate_no_sync', 'check_epoch_shards', 'check_eval_shard', 'check_save_checkpoint_once']
