"""Replay: the buffer and its checkpoint state (buffer.py, whose names this package exports), n-step transitions
(nstep.py), Atari frames stored once (frames.py) and prioritized sampling on pure-torch trees (prioritized.py)."""
from offpolicy.replay.buffer import (ReplayJournal, journal_dir, make_replay_buffer, n_step_transform,
                                     replay_scratch_dir, replay_state, restore_replay, sample_shape)

__all__ = ["ReplayJournal", "journal_dir", "make_replay_buffer", "n_step_transform", "replay_scratch_dir",
           "replay_state", "restore_replay", "sample_shape"]
