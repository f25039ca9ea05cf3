"""Atari replay that stores each frame once (``replay.frames_once``): a transition costs one 84x84 frame (~7 KB)
instead of two 4-frame stacks (56 KB), so a 1M replay fits in ~7 GB. The stacks (observation and next observation)
are rebuilt when sampling, as Dopamine and SB3's ``optimize_memory_usage`` do.

Why our own: torchrl 0.14.1 rebuilds stacks only along sampled sub-trajectories (``SliceSampler`` + ``CatFrames``),
which replays ``slice_len`` consecutive frames to use one; its compact collector mode rebuilds the next observation
only within a sampled slice (``NextStateReconstructor``). Uniform replay of single transitions needs an index into
each env's frame stream, which is what this class keeps.

Layout: one ring of slots per training env, written in time order. A slot holds the newest frame of the step's
observation and the step's (n-step) transition; when a game ends (or is truncated) one more slot holds the final
frame, marked as no transition. A stack is the slot's frame and the ``frame_stack - 1`` before it, with the frames
before the episode's first slot zero, as ALE's ``AtariVectorEnv`` stacks them after a reset; the next observation of
slot ``p`` is the stack of slot ``p + steps_to_next_obs``. A lost life does not break the stream (the game goes on,
and so does ALE's stack). After each write the frame that follows the batch is kept provisionally in the next slot:
the next batch starts with that same frame and overwrites it, or, when the stream restarts (a resumed run resets its
envs), it is kept as a final frame.
"""
from __future__ import annotations

import math

import torch
from tensordict import TensorDict, TensorDictBase

from offpolicy.replay.nstep import n_step_transitions

# per slot, besides the frame: action (int16), reward (float32), steps_to_next_obs (uint8), terminated, truncated,
# done, episode start, is-a-transition (bool each) and policy_version (int32)
SLOT_EXTRA_BYTES = 2 + 4 + 1 + 5 + 4


def ring_slots(size: int, num_envs: int, frame_stack: int) -> int:
    """Slots of each env's ring for ``size`` transitions: its share, the history of the oldest kept transition, the
    provisional frame and 1/64 more for final frames (one per game: Atari games run for hundreds of steps), so about
    ``size`` transitions are held."""
    per_env = math.ceil(size / num_envs)
    return per_env + frame_stack + 1 + math.ceil(per_env / 64)


def frame_replay_bytes_per_transition(size: int, num_envs: int, frame_stack: int, image_size: int) -> int:
    """Replay bytes per transition: every slot (one grey frame and its fields) over ``size``."""
    slot_bytes = image_size * image_size + SLOT_EXTRA_BYTES
    return math.ceil(ring_slots(size, num_envs, frame_stack) * num_envs * slot_bytes / size)


class FrameReplay:
    """``size`` transitions of ``num_envs`` Atari envs, frames stored once, sampled uniformly.

    Offers what the engine and the learner use of a torchrl replay buffer: ``extend`` (one collected batch,
    flattened ``[num_envs * T]`` env by env), ``sample``, ``len``, ``write_count``, ``state_dict`` and
    ``load_state_dict``. Writes apply ``n_steps``-step returns (:func:`offpolicy.replay.nstep.n_step_transitions`).
    """

    def __init__(self, size: int, num_envs: int, frame_stack: int, n_steps: int = 1, gamma: float = 0.99,
                 generator: torch.Generator | None = None):
        self.num_envs, self.frame_stack, self.n_steps, self.gamma = num_envs, frame_stack, n_steps, gamma
        self.slots = ring_slots(size, num_envs, frame_stack)
        self.generator = generator
        self.position = torch.zeros(num_envs, dtype=torch.int64)  # slots committed per env (absolute count)
        self.pending = torch.zeros(num_envs, dtype=torch.bool)  # a provisional frame waits at ``position``
        self.write_count = 0
        self.data: TensorDict | None = None  # allocated on the first write, from its shapes
        self.action_dtype: torch.dtype | None = None
        self.n_actions = 0

    # --- writing ------------------------------------------------------------------------------------------------
    def _allocate(self, batch: TensorDictBase) -> None:
        height, width = batch.get("observation").shape[-2:]
        shape = (self.num_envs, self.slots)
        self.action_dtype, self.n_actions = batch.get("action").dtype, batch.get("action").shape[-1]
        self.data = TensorDict({
            "frame": torch.zeros(*shape, height, width, dtype=torch.uint8),
            "action": torch.zeros(shape, dtype=torch.int16), "reward": torch.zeros(shape),
            "steps": torch.zeros(shape, dtype=torch.uint8), "terminated": torch.zeros(shape, dtype=torch.bool),
            "truncated": torch.zeros(shape, dtype=torch.bool), "done": torch.zeros(shape, dtype=torch.bool),
            "first": torch.zeros(shape, dtype=torch.bool), "transition": torch.zeros(shape, dtype=torch.bool),
            "version": torch.zeros(shape, dtype=torch.int32),
        }, batch_size=shape)

    def extend(self, batch: TensorDictBase) -> None:
        """Write one collected batch (``[num_envs * T]``, env by env, time order within each env)."""
        rollout = batch.reshape(self.num_envs, -1)
        if self.data is None:
            self._allocate(rollout)
        steps = n_step_transitions(rollout, self.n_steps, self.gamma) if self.n_steps > 1 else rollout
        nxt = rollout.get("next")
        lost = nxt.get("life_lost", None)
        # the stream restarts after a step whose next observation is not the next step's: a game over or truncation
        # (a lost life only ends the training episode)
        restart = nxt.get("done").reshape(rollout.shape)
        if lost is not None:
            restart = restart & ~lost.reshape(rollout.shape)
        first = rollout.get("is_init").reshape(rollout.shape)
        new = steps.get("next")
        fields = {
            "frame": rollout.get("observation")[..., -1, :, :],
            "action": steps.get("action").argmax(-1).to(torch.int16),
            "reward": new.get("reward").reshape(rollout.shape),
            "steps": (steps.get("steps_to_next_obs").reshape(rollout.shape) if self.n_steps > 1
                      else torch.ones(rollout.shape, dtype=torch.uint8)),
            "terminated": new.get("terminated").reshape(rollout.shape),
            "truncated": new.get("truncated").reshape(rollout.shape),
            "done": new.get("done").reshape(rollout.shape),
            "first": first, "transition": torch.ones(rollout.shape, dtype=torch.bool),
            "version": new.get("policy_version").reshape(rollout.shape).to(torch.int32),
        }
        final_frame = nxt.get("observation")[..., -1, :, :]
        length = rollout.shape[1]
        for env in range(self.num_envs):
            # a provisional frame followed by a new episode (a resumed run): keep it as the final frame
            base = int(self.position[env]) + int(bool(self.pending[env]) and bool(first[env, 0]))
            before = torch.cumsum(restart[env].long(), 0) - restart[env].long()  # final-frame slots before step t
            offsets = torch.arange(length) + before
            self._write(env, base + offsets, {k: v[env] for k, v in fields.items()})
            ends = restart[env].nonzero().squeeze(-1)
            self._write_final(env, base + offsets[ends] + 1, final_frame[env, ends])
            count = length + len(ends)
            # the frame after the batch, provisionally in the next slot (overwritten by the next batch's first)
            self.pending[env] = not bool(restart[env, -1])
            if self.pending[env]:
                self._write_final(env, torch.tensor([base + count]), final_frame[env, -1:])
            self.position[env] = base + count
        self.write_count += rollout.numel()

    def _write(self, env: int, positions: torch.Tensor, values: dict) -> None:
        slots = positions % self.slots
        for key, value in values.items():
            target = self.data.get(key)
            target[env, slots] = value.reshape(len(slots), *target.shape[2:]).to(target.dtype)

    def _write_final(self, env: int, positions: torch.Tensor, frames: torch.Tensor) -> None:
        """Slots holding only a frame (an episode's final one): no transition starts there."""
        slots = positions % self.slots
        self.data.get("frame")[env, slots] = frames
        self.data.get("transition")[env, slots] = False
        self.data.get("first")[env, slots] = False

    # --- sampling -----------------------------------------------------------------------------------------------
    def _oldest(self) -> torch.Tensor:
        """The oldest position per env whose stack history is still kept (the ring overwrote what came before)."""
        return (self.position + self.pending.long() - self.slots + self.frame_stack).clamp(min=0)

    def __len__(self) -> int:
        if self.data is None:
            return 0
        held = 0
        for env in range(self.num_envs):
            start, end = int(self._oldest()[env]), int(self.position[env])
            slots = torch.arange(start, end) % self.slots
            held += int(self.data.get("transition")[env, slots].sum())
        return held

    def stack(self, env: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        """The observation stacks ``[B, frame_stack, H, W]`` at absolute ``position`` of ``env``."""
        offsets = torch.arange(-self.frame_stack + 1, 1)
        positions = position.unsqueeze(-1) + offsets  # [B, frame_stack], oldest first
        slots = positions % self.slots
        env = env.unsqueeze(-1)
        frames = self.data.get("frame")[env, slots]
        # frame j is zero when the episode started after it: a first slot among the later positions
        first = self.data.get("first")[env, slots] & (positions >= 0)
        started_after = first.flip(-1).cumsum(-1).flip(-1) - first.long()  # first slots strictly after frame j
        return frames * (started_after == 0).unsqueeze(-1).unsqueeze(-1)

    def sample(self, batch_size: int) -> TensorDict:
        """``batch_size`` transitions drawn uniformly (with replacement) from what is held."""
        env, position = self._draw(batch_size)
        slots = position % self.slots
        row = self.data[env, slots]
        steps = row.get("steps").long()
        shape = (batch_size, 1)
        action = torch.nn.functional.one_hot(row.get("action").long(), self.n_actions).to(self.action_dtype)
        return TensorDict({
            "observation": self.stack(env, position), "action": action,
            "steps_to_next_obs": steps.unsqueeze(-1),
            "next": {"observation": self.stack(env, position + steps), "reward": row.get("reward").reshape(shape),
                     "terminated": row.get("terminated").reshape(shape),
                     "truncated": row.get("truncated").reshape(shape), "done": row.get("done").reshape(shape),
                     "policy_version": row.get("version").long()},
        }, batch_size=[batch_size])

    def _draw(self, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Uniform draws of (env, position) among held transitions: draw, keep those that start a transition, repeat
        for the rest (final-frame slots are about one in a thousand)."""
        if self.write_count == 0:
            raise RuntimeError("cannot sample from an empty FrameReplay")
        oldest, newest = self._oldest(), self.position  # positions [oldest, newest) are committed and kept
        spans = (newest - oldest).float()
        envs, positions = [], []
        missing = batch_size
        while missing:  # envs drawn by their span, so every kept slot is equally likely
            env = torch.multinomial(spans, 2 * missing, replacement=True, generator=self.generator)
            span = (newest - oldest)[env]
            position = oldest[env] + (torch.rand(2 * missing, generator=self.generator) * span).long()
            keep = (span > 0) & self.data.get("transition")[env, position % self.slots]
            envs.append(env[keep][:missing])
            positions.append(position[keep][:missing])
            missing -= len(envs[-1])
        return torch.cat(envs), torch.cat(positions)

    # --- checkpoints --------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"data": None if self.data is None else self.data.to_dict(), "position": self.position.clone(),
                "pending": self.pending.clone(), "write_count": self.write_count,
                "action_dtype": None if self.action_dtype is None else str(self.action_dtype).split(".")[-1],
                "n_actions": self.n_actions, "slots": self.slots, "num_envs": self.num_envs}

    def load_state_dict(self, state: dict) -> None:
        if (state["slots"], state["num_envs"]) != (self.slots, self.num_envs):
            raise ValueError(f"saved FrameReplay has {state['num_envs']} envs x {state['slots']} slots; this one "
                             f"{self.num_envs} x {self.slots}")
        self.data = None if state["data"] is None else TensorDict(state["data"], batch_size=[self.num_envs,
                                                                                              self.slots])
        self.position, self.pending = state["position"].clone(), state["pending"].clone()
        self.write_count, self.n_actions = int(state["write_count"]), int(state["n_actions"])
        self.action_dtype = None if state["action_dtype"] is None else getattr(torch, state["action_dtype"])
