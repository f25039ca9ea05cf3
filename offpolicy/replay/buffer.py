"""Replay: the buffer the collectors write into and the learner samples from (torchrl storages and samplers), its
checkpoint state, and the shape of a sampled optimisation batch."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from omegaconf import DictConfig

from shared import compat
from shared.config import ensure_writable_dir


def replay_scratch_dir(cfg: DictConfig, run_dir: Path) -> Path:
    """Where a memmap replay keeps its files: ``replay.scratch_dir`` or ``<run_dir>/replay``."""
    return Path(cfg.replay.scratch_dir) if cfg.replay.scratch_dir else Path(run_dir) / "replay"


def make_replay_buffer(cfg: DictConfig, run_dir: Path | None = None):
    """The replay buffer: FIFO of ``replay.size`` transitions in RAM or memory-mapped files (``replay.storage``),
    sampled uniformly, by priority (``replay.prioritized``) or as sub-trajectories of ``replay.slice_len`` steps
    (``optim.batch_size / slice_len`` of them, so each step still replays ``batch_size`` transitions); written as
    ``loss.n_steps``-step transitions. Atari with ``replay.frames_once``: each frame stored once
    (:class:`~offpolicy.replay.frames.FrameReplay`)."""
    from torchrl.data import LazyMemmapStorage, LazyTensorStorage, TensorDictReplayBuffer
    from torchrl.data.replay_buffers import RandomSampler, SliceSampler

    size = cfg.replay.size
    if cfg.replay.frames_once:
        from offpolicy.replay.frames import FrameReplay

        return FrameReplay(size, cfg.env.num_envs, cfg.env.atari.frame_stack, int(cfg.loss.n_steps), cfg.loss.gamma)
    if cfg.replay.storage == "memmap":
        key = "replay.scratch_dir" if cfg.replay.scratch_dir else "run_dir"
        ensure_writable_dir(replay_scratch_dir(cfg, run_dir), key)
        # existsok: a rerun into the same directory overwrites it (torchrl refuses an existing dir by default)
        storage = LazyMemmapStorage(size, scratch_dir=str(replay_scratch_dir(cfg, run_dir)), existsok=True)
    else:
        storage = LazyTensorStorage(size)
    # sub-trajectories are told apart by the collector's trajectory ids; each slice ends with truncated=True, so the
    # value estimator bootstraps there and never across slices
    slices = {"slice_len": cfg.replay.slice_len, "traj_key": ("collector", "traj_ids"),
              "truncated_key": ("next", "truncated"), "strict_length": True}
    if cfg.replay.prioritized:
        from offpolicy.replay.prioritized import TorchPrioritizedSampler, TorchPrioritizedSliceSampler  # noqa: I001

        priorities = {"max_capacity": size, "alpha": cfg.replay.alpha, "beta": cfg.replay.beta}
        if cfg.replay.slice_len:
            sampler = TorchPrioritizedSliceSampler(**priorities, **slices)
        else:
            sampler = TorchPrioritizedSampler(**priorities)
    elif cfg.replay.slice_len:
        sampler = SliceSampler(**slices)
    else:
        sampler = RandomSampler()
    # the learner passes its batch size
    return TensorDictReplayBuffer(storage=storage, sampler=sampler, transform=n_step_transform(cfg))


def n_step_transform(cfg: DictConfig):
    """The replay transform writing ``loss.n_steps``-step transitions (None for 1-step); each write is one
    collector's batch of ``env.num_envs`` envs."""
    if cfg.loss.n_steps == 1:
        return None
    from offpolicy.replay.nstep import NStepReturns

    return NStepReturns(int(cfg.loss.n_steps), cfg.loss.gamma, cfg.env.num_envs)  # a YAML 3.0 is an int here


class ReplayJournal:
    """Undo log of a memmap replay: before a write overwrites stored transitions (once the ring is full), they are
    saved, atomically, into ``directory``; a resume rolls the files back to the checkpoint's content with them.

    Why: a memmap buffer's files run ahead of the latest checkpoint. Once the ring wraps, a resume from that checkpoint
    would find transitions collected after it (by policies the resumed learner never had) in place of the ones it
    saved, and stop at the first sample (the policy-version invariant). Journals are kept from the checkpoint before
    the latest one on (that one may be a partial write when the process dies), so the disk holds at most two
    checkpoint intervals of overwritten transitions.
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.kept_from = 0  # journals of writes before this write count are no longer needed

    def before_write(self, replay, n: int) -> None:
        """Save what the next write of ``n`` transitions will overwrite (nothing until the buffer is full)."""
        index = (compat.replay_write_cursor(replay) + torch.arange(n)) % replay.storage.max_size
        index = index[index < len(replay)]
        if not len(index):
            return
        from tensordict import TensorDict

        partial = self.directory / f".partial-{replay.write_count}"
        shutil.rmtree(partial, ignore_errors=True)
        TensorDict({"index": index, "data": replay.storage.get(index)}, [len(index)]).memmap(partial)
        partial.rename(self.directory / f"{replay.write_count:015d}")  # named by the write count it precedes

    def checkpointed(self, write_count: int) -> None:
        """A checkpoint at ``write_count`` is being written: drop the journals older than the previous one."""
        for count, path in self._entries():
            if count < self.kept_from:
                shutil.rmtree(path)
        self.kept_from = write_count

    def roll_back(self, scratch_dir: Path, write_count: int) -> int:
        """Undo, in the memmap files of ``scratch_dir``, every write made at or after ``write_count`` (a checkpoint's),
        newest first; then forget every journal. Returns how many transitions were put back."""
        from tensordict import TensorDict

        restored = 0
        entries = [(count, path) for count, path in self._entries() if count >= write_count]
        if entries:
            data = TensorDict.load_memmap(scratch_dir)
            for _, path in reversed(entries):
                saved = TensorDict.load_memmap(path)
                data[saved["index"]] = saved["data"]
                restored += len(saved)
        for path in self.directory.iterdir():
            shutil.rmtree(path)
        return restored

    def _entries(self) -> list[tuple[int, Path]]:
        return sorted((int(p.name), p) for p in self.directory.iterdir() if p.name.isdigit())


def journal_dir(cfg: DictConfig, run_dir: Path) -> Path:
    """Where a memmap replay's undo journal lives: beside its scratch dir, ``<scratch_dir>-journal``."""
    scratch = replay_scratch_dir(cfg, run_dir)
    return scratch.with_name(scratch.name + "-journal")


def replay_state(cfg: DictConfig, replay) -> dict:
    """The replay buffer's checkpoint state; a memmap buffer's data stays in its scratch dir (only its length,
    cursor and sampler state go into the checkpoint)."""
    state = replay.state_dict()
    return compat.replay_state_without_data(state) if cfg.replay.storage == "memmap" else state


def restore_replay(cfg: DictConfig, replay, state: dict, run_dir: Path) -> None:
    """Load :func:`replay_state`; a memmap buffer reopens the files in its scratch dir."""
    if cfg.replay.storage == "memmap":
        compat.reopen_memmap_replay(replay, replay_scratch_dir(cfg, run_dir), state)
    else:
        replay.load_state_dict(state)


def sample_shape(cfg: DictConfig, world_size: int = 1) -> tuple[int, ...]:
    """Shape of the batch one of ``world_size`` learner ranks samples: ``[batch_size / world_size]``, or
    ``[batch_size / slice_len, slice_len]`` (slices are local-engine only)."""
    if cfg.replay.slice_len:
        return (cfg.optim.batch_size // cfg.replay.slice_len, cfg.replay.slice_len)
    return (cfg.optim.batch_size // world_size,)
