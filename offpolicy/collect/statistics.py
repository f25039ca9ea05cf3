"""What collection brings: a collected batch as replay stores it (:func:`for_replay`), the round's statistics kept
while collecting (:class:`RolloutStats`, in this process or inside each Ray collector actor), and what the engine
reports of a round's collection (:class:`Rollout`)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from offpolicy.envs import reported_env_fault


def for_replay(rollout):
    """A collected rollout as replay stores it: ``[num_envs, T] -> [num_envs * T]`` single transitions; on Atari a
    lost life ends the training episode there (``terminated``: no bootstrap, DeepMind's episodic life) while the
    game itself goes on, and each transition's action is the one the game ran (FIRE after a lost life). Runs in this
    process (local) or in each Ray collector actor."""
    batch = rollout.reshape(-1)
    executed = batch.get(("next", "executed_action"), None)
    if executed is not None:  # Atari: FIRE ran after a lost life whatever the policy chose (shared/atari.py)
        action = batch.get("action")
        ran = torch.nn.functional.one_hot(executed.reshape(-1).long(), action.shape[-1])
        batch.set("action", ran.to(action.dtype))
    lost = batch.get(("next", "life_lost"), None)
    if lost is not None:
        for key in ("terminated", "done"):
            ended = batch.get(("next", key))
            batch.set(("next", key), ended | lost.reshape(ended.shape))
    return batch


def next_batch(batches, env):
    """The next batch of the collector iterator ``batches`` over the training env ``env``, as replay stores it
    (:func:`for_replay`); when collection fails because an env worker process exited (``env.vector=process``), the
    EnvFault that worker reported instead of torchrl's error, which names only the worker."""
    try:
        return for_replay(next(batches))
    except Exception as exc:
        fault = reported_env_fault(env)
        if fault is None:
            raise
        raise fault from exc


@dataclass
class Rollout:
    """What one round of collection brought: counts, finished episodes, the policy versions it was collected with
    (None when nothing was collected), rewards and actions (for the action statistics)."""

    env_steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[float] = field(default_factory=list)
    version_lo: int | None = None
    version_hi: int | None = None
    reward_sum: float = 0.0
    actions: torch.Tensor | None = None
    collectors: int = 1

    @staticmethod
    def merge(parts: list["Rollout"]) -> "Rollout":
        """One round's rollout from several collectors' rollouts."""
        versions = [(p.version_lo, p.version_hi) for p in parts if p.version_lo is not None]
        actions = [p.actions for p in parts if p.actions is not None and len(p.actions)]
        return Rollout(env_steps=sum(p.env_steps for p in parts), returns=[r for p in parts for r in p.returns],
                       lengths=[n for p in parts for n in p.lengths],
                       version_lo=min(v[0] for v in versions) if versions else None,
                       version_hi=max(v[1] for v in versions) if versions else None,
                       reward_sum=sum(p.reward_sum for p in parts),
                       actions=torch.cat(actions) if actions else None, collectors=len(parts))


class RolloutStats:
    """Called on every collected (flattened) batch: counts transitions, keeps finished episodes, the policy versions
    and the actions, until :meth:`drain` returns them as a :class:`Rollout`. Runs in this process (local) or inside
    each Ray collector actor (its ``post_collect_hook``)."""

    def __init__(self):
        self.pending: list = []

    def __call__(self, batch) -> None:
        self.pending.append(batch)

    def drain(self) -> Rollout:
        """This round's statistics; starts a new round."""
        batches, self.pending = self.pending, []
        if not batches:
            return Rollout()
        batch = torch.cat([b.reshape(-1) for b in batches]) if len(batches) > 1 else batches[0].reshape(-1)
        nxt = batch.get("next")
        if "game_over" in nxt.keys():  # Atari: whole games with raw scores, not the (per-life) training episodes
            done, returns, lengths = (nxt.get(k).reshape(-1) for k in ("game_over", "game_score", "game_length"))
        else:
            done, returns, lengths = (nxt.get(k).reshape(-1) for k in ("done", "episode_reward", "step_count"))
        versions = nxt.get("policy_version")  # the root key lags one step behind
        return Rollout(env_steps=batch.numel(), returns=returns[done].float().tolist(),
                       lengths=lengths[done].float().tolist(),
                       version_lo=int(versions.min()), version_hi=int(versions.max()),
                       reward_sum=float(nxt.get("reward").float().sum()),
                       actions=batch.get("action").reshape(batch.numel(), -1).float())
