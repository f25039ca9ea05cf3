"""The Ray engine's collector actors, kept alive: :class:`CollectorPool` runs the rounds and publishes the weights,
and replaces an actor that dies (during a batch, a replay write or a weight publication) with a new one on fresh env
seeds and the current weights, up to ``ray.max_collector_restarts`` times in a run.

Each actor (:class:`CollectorActor`) runs what the local engine runs in its own process: the run's collector from
:meth:`Builder.collector` (our lean collector for Gymnasium state-vector envs, torchrl's ``Collector`` otherwise),
each batch flattened by :func:`for_replay` and written into the replay actor, its statistics kept by a
:class:`RolloutStats`. Why not torchrl's ``RayCollector``: its actors are torchrl ``Collector``s, which cost ~2 ms
per CartPole env step inside an actor here (the lean collector: ~0.2 ms; a Ray SAC run spent 2.1 s of every
1,000-step round collecting, against 0.4 s locally), its round iterator ends with the first ``RayActorError``, and
its default weight sync joins the driver and every actor in one torch.distributed group, which a dead member breaks
for good. Weights go through Ray's object store (one ``ray.put`` per publication).
"""
from __future__ import annotations

import contextlib
import time

import torch
from omegaconf import DictConfig, OmegaConf

from offpolicy.builder import Builder
from offpolicy.envs import collector_seed
from offpolicy.invariants import InvariantError
from offpolicy.rollout import Rollout, RolloutStats, for_replay

WRITES_SETTLE_S = 0.5  # a dead actor's last replay write may still be queued at the replay actor: wait this long quiet


class CollectorActor:
    """One collector (a Ray actor): ``env.num_envs`` env copies of seed slot ``slot``, the stochastic ``policy``,
    batches of ``collector.env_steps_per_batch / ray.num_collectors`` transitions written into ``replay``."""

    def __init__(self, cfg: dict, policy, replay, slot: int, seed: int, obs_norm: dict | None):
        cfg = OmegaConf.create(cfg)
        builder = Builder(cfg)
        first_seed = collector_seed(seed, slot, cfg.env.num_envs)
        device = torch.device("cuda") if cfg.ray.collector_gpus else None  # then torchrl's Collector (lean: CPU)
        self.policy = policy.to(device) if device is not None else policy
        share = cfg.collector.env_steps_per_batch // cfg.ray.num_collectors
        self.collector = builder.collector(builder.train_env(obs_norm, seed=first_seed), self.policy, first_seed,
                                           env_steps_per_batch=share, policy_device=device)
        self.replay = replay
        self.stats = RolloutStats()
        self.batches = iter(self.collector)

    def collect(self) -> None:
        """One batch into replay (what :meth:`LocalEngine.collect` does in the training process)."""
        batch = for_replay(next(self.batches))
        self.replay.extend(batch)
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
    flattened rollouts into ``replay``; one :meth:`round` collects ``collector.env_steps_per_batch`` in all."""

    def __init__(self, cfg: DictConfig, policy, replay, obs_norm: dict | None, seed: int):
        import ray

        self.policy, self.replay = policy, replay
        self.count = cfg.ray.num_collectors
        self.share = cfg.collector.env_steps_per_batch // self.count  # transitions per actor per round
        self.max_restarts, self.restarts = cfg.ray.max_collector_restarts, 0
        self.timeout = float(cfg.ray.step_timeout_s)
        self.version = 0  # publications so far (the policy version every actor holds)
        self.failure: CollectorsExhausted | None = None  # a death past the limit in a publication, raised next round
        self.config, self.obs_norm, self.seed = OmegaConf.to_container(cfg, resolve=True), obs_norm, seed
        resources = {"num_cpus": cfg.ray.collector_cpus}
        if cfg.ray.collector_gpus:
            resources["num_gpus"] = cfg.ray.collector_gpus
        self.actor_class = ray.remote(**resources)(CollectorActor)
        self.actors = []
        for slot in range(self.count):
            self.actors.append(self._start(slot))

    def _start(self, slot: int):
        return self.actor_class.remote(self.config, self.policy, self.replay.client(), slot, self.seed, self.obs_norm)

    def round(self) -> Rollout:
        """Every actor collects its share with the published policy and writes it into replay. A dead actor is
        replaced and its share collected again, unless the share reached replay before the actor died: then only its
        episode statistics are lost with it (also when it dies after its batch, before its statistics are read)."""
        if self.failure is not None:
            raise self.failure
        expected = self.replay.write_count + self.share * self.count
        results, dead = self._gather([actor.collect.remote() for actor in self.actors])
        lost = 0  # shares in replay whose statistics died with their actor
        while dead:  # ends: every death uses one of the ray.max_collector_restarts replacements
            for i in dead:
                self._replace(i, results[i])
            short = expected - self._settled_writes()
            missing, leftover = divmod(short, self.share)
            if leftover or not 0 <= missing <= len(dead):
                raise InvariantError(f"replay is {short} transitions short of a round of {self.count} collectors x "
                                     f"{self.share} with {len(dead)} collector(s) dead")
            lost += len(dead) - missing
            again = dead[:missing]
            results, dead_again = self._gather([self.actors[i].collect.remote() for i in again])
            results = dict(zip(again, results))
            dead = [again[j] for j in dead_again]
        stats, dead = self._gather([actor.drain.remote() for actor in self.actors])
        for i in dead:
            self._replace(i, stats[i])
        lost += len(dead)
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
            ray.kill(actor)

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

        results, dead = [], []
        deadline = time.monotonic() + self.timeout
        for i, ref in enumerate(refs):
            try:
                results.append(ray.get(ref, timeout=max(deadline - time.monotonic(), 0.0)))
            except ray.exceptions.RayActorError as exc:
                results.append(exc)
                dead.append(i)
        return results, dead

    def _replace(self, i: int, error: BaseException) -> None:
        """A new actor in place of dead actor ``i``: fresh env seeds, the driver's policy (the published weights and
        exploration state) and the current version. Past ``ray.max_collector_restarts`` the run ends with the dead
        actor's error."""
        import ray

        if self.restarts == self.max_restarts:
            raise CollectorsExhausted(f"no replacement left (ray.max_collector_restarts={self.max_restarts})"
                                      ) from error
        self.restarts += 1
        ray.kill(self.actors[i])  # dead already; makes sure its CPU reservation is freed
        slot = i + self.count * self.restarts  # past every slot used before: no env stream repeats
        self.actors[i] = self._start(slot)
        print(f"ray: collector {i} died; replaced by a new actor on env seed slot {slot} "
              f"(restart {self.restarts} of {self.max_restarts})", flush=True)
        self._ask(i, "set_version", self.version)  # (a death here uses another restart)

    def _settled_writes(self) -> int:
        """The replay's write count once no write has arrived for :data:`WRITES_SETTLE_S`."""
        last = self.replay.write_count
        while True:
            time.sleep(WRITES_SETTLE_S)
            now = self.replay.write_count
            if now == last:
                return now
            last = now


class CollectorsExhausted(RuntimeError):
    """More collector actors died than ``ray.max_collector_restarts`` allows."""
