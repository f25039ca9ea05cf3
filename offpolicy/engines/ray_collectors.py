"""The Ray engine's collector actors, kept alive: :class:`CollectorPool` runs the rounds and publishes the weights,
and replaces an actor that dies (during a batch, a replay write or a weight publication) with a new one on fresh env
seeds and the current weights, up to ``ray.max_collector_restarts`` times in a run.

torchrl's ``RayCollector`` builds the actors (``add_collectors``: a ``Collector`` per actor writing into the replay
actor), but two of its parts cannot outlive a dead actor in torchrl 0.14.1, so they are done here:
- its round iterator ends with the first ``RayActorError`` (a generator cannot continue after raising);
- its default weight sync (``RayWeightSyncScheme``) joins the driver and every actor in one torch.distributed
  group, which a dead member breaks for good. Weights go through Ray's object store instead (one ``ray.put`` per
  publication, each actor copies them into its policy with ``Collector.update_policy_weights_``); for a few-MB
  policy that costs about what the broadcast did.
"""
from __future__ import annotations

import time
from functools import partial

from omegaconf import DictConfig
from torchrl.envs.llm.transforms import PolicyVersion

from offpolicy.builder import Builder
from offpolicy.envs import collector_seed
from offpolicy.invariants import InvariantError
from offpolicy.rollout import Rollout, RolloutStats, for_replay

WRITES_SETTLE_S = 0.5  # a dead actor's last replay write may still be queued at the replay actor: wait this long quiet


class SettableVersion(PolicyVersion):
    """torchrl's policy-version transform with a method to set the version, so a resumed run or a replacement actor
    joins at the current version in one call (``version`` is a property, which ``cascade_execute`` cannot set)."""

    def set_version(self, version: int) -> None:
        self.version = version


def _collector_env(builder: Builder, slot: int, obs_norm: dict | None, seed: int):
    """The envs of collector ``slot`` (a replacement takes a slot past every earlier one): the local training env with
    seeds apart from every other collector's."""
    return builder.train_env(obs_norm, seed=collector_seed(seed, slot, builder.cfg.env.num_envs))


class CollectorPool:
    """``ray.num_collectors`` collector actors that each run ``policy`` (stochastic) on ``env.num_envs`` envs and write
    flattened rollouts into ``replay``; one :meth:`round` collects ``collector.env_steps_per_batch`` in all."""

    def __init__(self, cfg: DictConfig, policy, replay, obs_norm: dict | None, seed: int):
        import torch
        from torchrl.collectors import Collector
        from torchrl.collectors.distributed import RayCollector
        from torchrl.envs.utils import ExplorationType

        self.policy, self.replay = policy, replay
        self.count = cfg.ray.num_collectors
        self.share = cfg.collector.env_steps_per_batch // self.count  # transitions per actor per round
        self.max_restarts, self.restarts = cfg.ray.max_collector_restarts, 0
        self.timeout = float(cfg.ray.step_timeout_s)
        self.version = 0  # publications so far (the policy version every actor holds)
        self.failure: CollectorsExhausted | None = None  # a death past the limit in a publication, raised next round
        self.make_env = partial(_collector_env, Builder(cfg), obs_norm=obs_norm, seed=seed)
        self.remote = {"num_cpus": cfg.ray.collector_cpus}
        if cfg.ray.collector_gpus:
            self.remote["num_gpus"] = cfg.ray.collector_gpus
        kwargs = {"track_policy_version": SettableVersion(), "auto_register_policy_transforms": False,
                  "postproc": for_replay, "post_collect_hook": RolloutStats()}
        self.ray_collector = RayCollector(
            [partial(self.make_env, slot=i) for i in range(self.count)], policy,
            frames_per_batch=cfg.collector.env_steps_per_batch,
            total_frames=2**62,  # never reached: rounds run in round(), the loop stops the run at total_env_steps
            collector_class=Collector, collector_kwargs=kwargs, remote_configs=self.remote,
            sync=True, replay_buffer=replay, exploration_type=ExplorationType.RANDOM,
            weight_sync_schemes={},  # weights go through the object store (publish), see the module docstring
            # a GPU collector runs its policy on the GPU Ray gives it; envs step and rollouts are stored on the CPU
            policy_device=torch.device("cuda") if cfg.ray.collector_gpus else None,
            env_device="cpu", storing_device="cpu",
            ray_init_config={"address": "auto"},  # never used: Ray is already up (start_ray)
        )

    @property
    def actors(self) -> list:
        return self.ray_collector.remote_collectors

    def round(self) -> Rollout:
        """Every actor collects its share with the published policy and writes it into replay. A dead actor is
        replaced and its share collected again, unless the share reached replay before the actor died: then only its
        episode statistics are lost with it (also when it dies after its batch, before its statistics are read)."""
        if self.failure is not None:
            raise self.failure
        expected = self.replay.write_count + self.share * self.count
        results, dead = self._gather([actor.next.remote() for actor in self.actors])
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
            results, dead_again = self._gather([self.actors[i].next.remote() for i in again])
            results = dict(zip(again, results))
            dead = [again[j] for j in dead_again]
        stats, dead = self._gather([actor.cascade_execute.remote("post_collect_hook.drain") for actor in self.actors])
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
            self.call("update_policy_weights_", ray.put(weights), replacement_answers=False)
            return min(self.call("get_policy_version"))
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
        self.call("update_policy_weights_", ray.put(weights), replacement_answers=False)
        self.call("policy_version_tracker.set_version", version)

    def close(self) -> None:
        self.ray_collector.shutdown()

    # --- failures -----------------------------------------------------------------------------------------------------
    def call(self, method: str, *args, replacement_answers: bool = True) -> list:
        """``method`` (a path into the actor's Collector) on every actor. A dead actor is replaced (the replacement
        holds the driver's weights and the current version already) and answers in its place, or, when
        ``replacement_answers`` is false (a publication: it would count one version too many), gives None."""
        results, dead = self._gather([actor.cascade_execute.remote(method, *args) for actor in self.actors])
        for i in dead:
            self._replace(i, results[i])
            results[i] = self._ask(i, method, *args) if replacement_answers else None
        return results

    def _ask(self, i: int, method: str, *args):
        """``method`` on actor ``i``, replacing it as long as it dies (within the restart budget)."""
        while True:
            results, dead = self._gather([self.actors[i].cascade_execute.remote(method, *args)])
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
        kwargs = {**self.ray_collector.collector_kwargs[i], "replay_buffer": self.replay.client(),
                  "post_collect_hook": RolloutStats(), "track_policy_version": SettableVersion()}
        slot = i + self.count * self.restarts  # past every slot used before: no env stream repeats
        actors = self.actors
        self.ray_collector.add_collectors([partial(self.make_env, slot=slot)], 1, self.policy, [kwargs], [self.remote])
        new = actors.pop()
        actors[i] = new
        if self.actors[i] is not new:  # torchrl handed out a copy: the replacement would never be asked
            raise RuntimeError("torchrl's RayCollector.remote_collectors is no longer its live list of actors: "
                               "collector replacement needs updating for this torchrl version")
        print(f"ray: collector {i} died; replaced by a new actor on env seed slot {slot} "
              f"(restart {self.restarts} of {self.max_restarts})", flush=True)
        self._ask(i, "policy_version_tracker.set_version", self.version)  # (a death here uses another restart)

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
