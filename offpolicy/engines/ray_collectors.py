"""The Ray engine's collector actors, kept alive: :class:`CollectorPool` runs the rounds and publishes the weights,
and replaces an actor that dies (during a batch, a replay write or a weight publication) with a new one on fresh env
seeds and the current weights, up to ``ray.max_collector_restarts`` times in a run.

Each actor (:class:`CollectorActor`) runs what the local engine runs in its own process: the run's collector from
:meth:`Builder.collector` (our lean collector for Gymnasium state-vector envs, torchrl's ``Collector`` otherwise),
each batch flattened by :func:`for_replay` and written into the replay actor, its statistics kept by a
:class:`RolloutStats`. Why not torchrl's ``RayCollector``: its actors are torchrl ``Collector``s, which cost about ten
times the lean collector per CartPole env step inside an actor (a Ray SAC run spent several times the local run's time
collecting; docs/ray.md), its round iterator ends with the first ``RayActorError``, and
its default weight sync joins the driver and every actor in one torch.distributed group, which a dead member breaks
for good. Weights go through Ray's object store (one ``ray.put`` per publication).

Accounting after a death: every write is one actor's share of one round, tagged with the actor's seed slot (one per
incarnation) and the round, and the replay actor (:class:`ShareReplayBuffer`) closes a dead actor's slot before the
pool decides: the answer (the last round that slot wrote) says whether the share is in replay, and a write of the dead
actor still on its way arrives after the close and is refused. Why: a killed actor's write may still be queued at the
replay actor when its death is seen, and no quiet period tells when it has run.
"""
from __future__ import annotations

import contextlib
import time

import torch
from omegaconf import DictConfig, OmegaConf
from torchrl.data import TensorDictReplayBuffer

from offpolicy import prepare_process
from offpolicy.builder import Builder
from offpolicy.collect.lean import torchrl_env_copies
from offpolicy.collect.statistics import Rollout, RolloutStats, next_batch
from offpolicy.envs import collector_seed


class ShareReplayBuffer(TensorDictReplayBuffer):
    """The replay actor's buffer: torchrl's, plus the collector actors' share writes, each tagged with the writer's
    seed slot and the round, and the closing of a dead writer's slot. The actor runs one call at a time (a Ray actor
    without ``max_concurrency``), so a close splits a dead writer's writes exactly into those before it (in replay,
    reported) and those after (refused)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.share_rounds: dict[int, int] = {}  # writer slot -> the last round whose share it wrote
        self.closed_writers: set[int] = set()

    def write_share(self, batch, writer: int, round_index: int) -> bool:
        """Write ``batch``, the share of round ``round_index`` of the actor on seed slot ``writer``, unless that slot
        was closed (its actor was found dead and replaced); returns whether it was written."""
        if writer in self.closed_writers:
            return False
        self.extend(batch)
        self.share_rounds[writer] = round_index
        return True

    def close_writer(self, writer: int) -> int | None:
        """Refuse every later write of slot ``writer``; returns the last round whose share it wrote (None: none)."""
        self.closed_writers.add(writer)
        return self.share_rounds.get(writer)


class CollectorActor:
    """One collector (a Ray actor): ``env.num_envs`` env copies of seed slot ``slot``, the stochastic ``policy``,
    batches of ``collector.env_steps_per_batch / ray.num_collectors`` transitions written into ``replay`` (a
    :class:`ShareReplayBuffer`, tagged with ``slot``)."""

    def __init__(self, cfg: dict, policy, replay, slot: int, seed: int, obs_norm: dict | None):
        prepare_process()  # the actor's process: a Ray worker that ran none of our code before
        cfg = OmegaConf.create(cfg)
        builder = Builder(cfg)
        first_seed = collector_seed(seed, slot, cfg.env.num_envs)
        device = torch.device("cuda") if cfg.ray.collector_gpus else None  # then torchrl's Collector (lean: CPU)
        self.policy = policy.to(device) if device is not None else policy
        share = cfg.collector.env_steps_per_batch // cfg.ray.num_collectors
        self.env = env = builder.train_env(obs_norm, seed=first_seed,
                                           num_envs=torchrl_env_copies(cfg, policy_on_cpu=device is None))
        self.collector = builder.collector(env, self.policy, first_seed, env_steps_per_batch=share,
                                           policy_device=device)
        self.replay, self.slot = replay, slot
        self.stats = RolloutStats()
        self.batches = iter(self.collector)

    def collect(self, round_index: int) -> None:
        """One batch into replay as this actor's share of round ``round_index`` (what :meth:`LocalEngine.collect`
        does in the training process)."""
        batch = next_batch(self.batches, self.env)
        if self.replay.write_share(batch, self.slot, round_index):  # refused: the pool replaced this actor already
            self.stats(batch)

    def drain(self) -> Rollout:
        return self.stats.drain()

    def publish(self, weights) -> int:
        """Copy ``weights`` (the collection policy's, exploration state included) into the policy; one version more."""
        weights.to_module(self.policy, inplace=True)
        self.collector.update_policy_weights_()
        return self.policy_version()

    def policy_version(self) -> int:
        return self.collector.policy_version

    def set_version(self, version: int) -> None:
        self.collector.policy_version_tracker.version = version

    def policy_state(self) -> dict:
        return {k: v.cpu() for k, v in self.policy.state_dict().items()}

    def shutdown(self) -> None:
        self.collector.shutdown()


class CollectorPool:
    """``ray.num_collectors`` collector actors that each run ``policy`` (stochastic) on ``env.num_envs`` envs and write
    flattened rollouts into ``replay`` (made by :func:`offpolicy.engines.ray.make_replay_actor`); one :meth:`round`
    collects ``collector.env_steps_per_batch`` in all. The actors are reached only through :meth:`_start`,
    :meth:`_gather` and :meth:`_kill` (the accounting tests put fake actors behind them), and ``ray.put``."""

    def __init__(self, cfg: DictConfig, policy, replay, obs_norm: dict | None, seed: int):
        import ray

        self.policy, self.replay = policy, replay
        self.writes = replay.client()  # the actors' way into replay, and the pool's to close a dead one's writes
        self.count = cfg.ray.num_collectors
        self.share = cfg.collector.env_steps_per_batch // self.count  # transitions per actor per round
        self.max_restarts, self.restarts = cfg.ray.max_collector_restarts, 0
        self.timeout = float(cfg.ray.step_timeout_s)
        self.version = 0  # publications so far (the policy version every actor holds)
        self.rounds = 0  # rounds started (the tag of this round's writes)
        self.failure: CollectorsExhausted | None = None  # a death past the limit in a publication, raised next round
        self.config, self.obs_norm, self.seed = OmegaConf.to_container(cfg, resolve=True), obs_norm, seed
        resources = {"num_cpus": cfg.ray.collector_cpus}
        if cfg.ray.collector_gpus:
            resources["num_gpus"] = cfg.ray.collector_gpus
        self.actor_class = ray.remote(**resources)(CollectorActor)
        self.slots = list(range(self.count))  # actor i's env seed slot, also the tag of its writes
        self.actors = [self._start(slot) for slot in self.slots]

    def _start(self, slot: int):
        return self.actor_class.remote(self.config, self.policy, self.writes, slot, self.seed, self.obs_norm)

    def round(self) -> Rollout:
        """Every actor collects its share with the published policy and writes it into replay. A dead actor is
        replaced and its share collected again, unless the share reached replay before the actor died (the replay
        actor says which, exactly): then only its episode statistics are lost with it (also when it dies after its
        batch, before its statistics are read)."""
        if self.failure is not None:
            raise self.failure
        self.rounds += 1
        holds = [False] * self.count  # whether actor i's statistics hold a share of this round
        lost = 0  # shares in replay whose statistics died with their actor
        todo = list(range(self.count))
        while todo:  # ends: every death uses one of the ray.max_collector_restarts replacements
            results, dead = self._gather([self.actors[i].collect.remote(self.rounds) for i in todo])
            again = []
            for j, i in enumerate(todo):
                if j not in dead:
                    holds[i] = True
                elif self._replace(i, results[j]) == self.rounds:
                    lost += 1  # its share is in replay
                else:
                    again.append(i)  # its share is not, and now cannot be: the replacement collects it
            todo = again
        stats, dead = self._gather([actor.drain.remote() for actor in self.actors])
        for i in dead:
            self._replace(i, stats[i])
            lost += holds[i]  # a replacement that died before collecting held no share
        # a share whose statistics died: its count, and the version every live actor held all round (each
        # publication is confirmed by every actor)
        share = Rollout(env_steps=self.share, version_lo=self.version, version_hi=self.version)
        return Rollout.merge([s for s in stats if isinstance(s, Rollout)] + [share] * lost)

    def publish(self, weights) -> int:
        """Send ``weights`` (the collection policy's, exploration state included; the driver's ``policy`` holds them
        already) to every actor; returns the lowest version an actor reports."""
        import ray

        self.version += 1
        try:
            # each actor copies the weights into its policy and counts one version more
            self.call("publish", ray.put(weights), replacement_answers=False)
            return min(self.call("policy_version"))
        except CollectorsExhausted as exc:
            # the learner has stepped in this round already: the run ends at the next collection, once the loop
            # has counted this round, so the checkpoint's counters match the learner's steps (every live actor
            # received the weights)
            self.failure = exc
            return self.version

    def restore(self, weights, version: int) -> None:
        """A resumed run: every actor gets ``weights`` and continues from policy version ``version``."""
        import ray

        self.version = version
        self.call("publish", ray.put(weights), replacement_answers=False)
        self.call("set_version", version)

    def close(self) -> None:
        import ray

        for actor in self.actors:
            with contextlib.suppress(Exception):  # dead or stuck: killed below either way
                ray.get(actor.shutdown.remote(), timeout=10)
            self._kill(actor)

    # --- failures -----------------------------------------------------------------------------------------------------
    def call(self, method: str, *args, replacement_answers: bool = True) -> list:
        """:class:`CollectorActor` ``method`` on every actor. A dead actor is replaced (the replacement holds the
        driver's weights and the current version already) and answers in its place, or, when
        ``replacement_answers`` is false (a publication: it would count one version too many), gives None."""
        results, dead = self._gather([getattr(actor, method).remote(*args) for actor in self.actors])
        for i in dead:
            self._replace(i, results[i])
            results[i] = self._ask(i, method, *args) if replacement_answers else None
        return results

    def _ask(self, i: int, method: str, *args):
        """``method`` on actor ``i``, replacing it as long as it dies (within the restart budget)."""
        while True:
            results, dead = self._gather([getattr(self.actors[i], method).remote(*args)])
            if not dead:
                return results[0]
            self._replace(i, results[0])

    def _gather(self, refs: list) -> tuple[list, list[int]]:
        """Each ref's result, and the indices whose actor died (the error in its place)."""
        import ray
        import ray.exceptions

        results, dead, failure = [], [], None
        deadline = time.monotonic() + self.timeout
        for i, ref in enumerate(refs):
            try:
                results.append(ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0)))
            except ray.exceptions.RayActorError as exc:
                results.append(exc)
                dead.append(i)
            except ray.exceptions.RayTaskError as exc:  # raised in a live actor (an env fault): ends the run, once
                results.append(exc)  # every result is read (Ray prints the ones never read as unhandled errors)
                failure = failure or exc
        if failure is not None:
            raise failure
        return results, dead

    def _kill(self, actor) -> None:
        import ray

        ray.kill(actor)

    def _replace(self, i: int, error: BaseException) -> int | None:
        """A new actor in place of dead actor ``i``: fresh env seeds, the driver's policy (the published weights and
        exploration state) and the current version. Returns the last round whose share the dead actor wrote into
        replay (None: none), read as its writes are closed (one still on its way is refused). Past
        ``ray.max_collector_restarts`` the run ends with the dead actor's error."""
        written = self.writes.close_writer(self.slots[i])
        if self.restarts == self.max_restarts:
            raise CollectorsExhausted(f"no replacement left (ray.max_collector_restarts={self.max_restarts})"
                                      ) from error
        self.restarts += 1
        self._kill(self.actors[i])  # dead already; makes sure its CPU reservation is freed
        self.slots[i] = i + self.count * self.restarts  # past every slot used before: no env stream repeats
        self.actors[i] = self._start(self.slots[i])
        print(f"ray: collector {i} died; replaced by a new actor on env seed slot {self.slots[i]} "
              f"(restart {self.restarts} of {self.max_restarts})", flush=True)
        self._ask(i, "set_version", self.version)  # (a death here uses another restart)
        return written


class CollectorsExhausted(RuntimeError):
    """More collector actors died than ``ray.max_collector_restarts`` allows."""
