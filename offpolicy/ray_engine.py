"""The Ray engine (``engine=ray``): the parts of engine.py placed on a Ray cluster, built from torchrl's own pieces.

- collectors: ``RayCollector`` over ``ray.num_collectors`` actors, each a torchrl ``Collector`` stepping
  ``env.num_envs`` envs; every rollout is flattened ``[B, T] -> [B*T]`` inside the actor and written straight into
  the replay actor;
- replay: a ``RayReplayBuffer`` (one Ray actor, 0 CPUs: it only stores and samples);
- learner: the algorithm's torchrl trainer with ``learner_backend="ray"``: ``ray.world_size`` ranks (Gloo on CPU,
  NCCL with one GPU each) each sample ``batch_size / world_size`` from the replay actor and average gradients (DDP);
  rank 0 publishes the policy to the collectors through a ``RayWeightSyncScheme``, stamped with the learner's
  optimiser-step version, which the collectors' ``PolicyVersion`` transform writes into every transition.

train.py runs the same loop on these parts; :class:`RayMonitor` is its per-round view (statistics gathered from the
collector actors, invariants, metrics) where the local engine's hooks see each batch in-process.
"""
from __future__ import annotations

import contextlib
import math
import os
import re
import time
from collections import deque
from functools import partial

import torch
from omegaconf import DictConfig, OmegaConf

from offpolicy import engine
from offpolicy.invariants import InvariantError, check_sample_batch
from offpolicy.metrics import action_stats
from shared.config import ConfigError


def ray_resources(cfg: DictConfig) -> dict[str, float]:
    """CPUs and GPUs the job reserves: collectors and learner ranks (the replay actor asks for none)."""
    r = cfg.ray
    return {"CPU": r.num_collectors * r.collector_cpus + r.world_size * r.learner_cpus,
            "GPU": r.num_collectors * r.collector_gpus + r.world_size * r.learner_gpus}


@contextlib.contextmanager
def ray_session(cfg: DictConfig):
    """Start Ray (local: bound to 127.0.0.1, no dashboard) or attach to ``ray.address``; check that the job's
    resources exist (an actor that cannot be placed would wait forever); always shut Ray down on exit."""
    try:
        import ray
    except ImportError:
        raise ConfigError("engine=ray needs Ray; allowed: engine=local, or install it: pip install -e '.[ray]'") from None

    local = cfg.ray.address is None
    kwargs = {"include_dashboard": False, "log_to_driver": cfg.ray.log_to_driver,
              "configure_logging": False}
    if local:
        _bind_to_localhost()
        kwargs.update(num_cpus=cfg.ray.num_cpus, num_gpus=cfg.ray.num_gpus)
    else:
        kwargs["address"] = cfg.ray.address
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"ray.address={cfg.ray.address!r}: cannot connect ({str(exc).splitlines()[0]}); "
                          "allowed: null (start a local Ray), auto or host:port of a running cluster") from None
    try:
        have = ray.cluster_resources()
        need = ray_resources(cfg)
        short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
        if short:
            what = ", ".join(f"{v:g} {k} (cluster has {h:g})" for k, (v, h) in short.items())
            raise ConfigError(f"ray: the job needs {what}; allowed: fewer ray.num_collectors / ray.world_size, "
                              "smaller ray.collector_cpus / learner_cpus / *_gpus, or a bigger cluster")
        yield
    finally:
        ray.shutdown()


def _bind_to_localhost() -> None:
    """Make a local Ray cluster listen on 127.0.0.1 only. ``ray.init(_node_ip_address="127.0.0.1")`` does not: Ray
    2.60 swaps a loopback node address for the machine's routable one unless its single-machine switch
    (``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, read at import, and torchrl imports ray early) is off. The variable is
    inherited by the raylet and every worker; Gloo's learner sockets go on the loopback device too."""
    from ray._private import ray_constants

    os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def flatten_rollout(rollout):
    """``[num_envs, T] -> [num_envs * T]``: replay stores single transitions (run in each collector actor)."""
    return rollout.reshape(-1)


class RolloutStats:
    """Runs inside each collector actor after every rollout (torchrl's ``post_collect_hook``): counts the
    transitions, keeps the finished episodes and the policy versions, for the driver to :meth:`drain` each round."""

    def __init__(self):
        self._clear()

    def _clear(self):
        self.returns, self.lengths = [], []
        self.version_lo = self.version_hi = None
        self.reward_sum, self.round_frames = 0.0, 0
        self.actions = []

    def __call__(self, rollout) -> None:
        self.round_frames += rollout.numel()
        done = rollout["next", "done"].reshape(-1)
        if done.any():
            self.returns += rollout["next", "episode_reward"].reshape(-1)[done].tolist()
            self.lengths += rollout["next", "step_count"].reshape(-1)[done].tolist()
        versions = rollout["next", "policy_version"]  # the root key lags one step behind
        lo, hi = int(versions.min()), int(versions.max())
        self.version_lo = lo if self.version_lo is None else min(lo, self.version_lo)
        self.version_hi = hi if self.version_hi is None else max(hi, self.version_hi)
        self.reward_sum += float(rollout["next", "reward"].float().sum())
        self.actions.append(rollout["action"].reshape(rollout.numel(), -1).float())

    def drain(self) -> dict:
        """This round's statistics; starts a new round."""
        out = {"round_frames": self.round_frames, "returns": self.returns,
               "lengths": self.lengths, "version_lo": self.version_lo, "version_hi": self.version_hi,
               "reward_sum": self.reward_sum,
               "actions": torch.cat(self.actions) if self.actions else torch.zeros(0, 1)}
        self._clear()
        return out


def _collector_env(cfg: DictConfig, index: int, obs_norm: dict | None):
    """Collector ``index``'s envs: the local training env with seeds apart from every other collector's."""
    cfg = OmegaConf.merge(cfg, {"seed": cfg.seed + 1000 * index})
    return engine.make_train_env(cfg, obs_norm)


def make_collector(cfg: DictConfig, policy, replay, obs_norm: dict | None):
    """``ray.num_collectors`` collector actors that each run ``policy`` (stochastic) on ``env.num_envs`` envs and
    write flattened rollouts into ``replay``; one round collects ``collector.frames_per_batch`` in all."""
    from torchrl.collectors import Collector
    from torchrl.collectors.distributed import RayCollector
    from torchrl.envs.llm.transforms import PolicyVersion
    from torchrl.envs.utils import ExplorationType

    n = cfg.ray.num_collectors
    remote = {"num_cpus": cfg.ray.collector_cpus}
    if cfg.ray.collector_gpus:
        remote["num_gpus"] = cfg.ray.collector_gpus
    kwargs = {"track_policy_version": PolicyVersion(), "auto_register_policy_transforms": False,
              "postproc": flatten_rollout, "post_collect_hook": RolloutStats()}
    return RayCollector(
        [partial(_collector_env, cfg, i, obs_norm) for i in range(n)], policy,
        frames_per_batch=cfg.collector.frames_per_batch,
        # torchrl 0.14.1: total_frames=-1 stops after one round; the trainer stops the run at total_frames
        total_frames=2**62, collector_class=Collector, collector_kwargs=kwargs, remote_configs=remote,
        sync=True, replay_buffer=replay, exploration_type=ExplorationType.RANDOM,
        # a GPU collector runs its policy on the GPU Ray gives it; envs step and rollouts are stored on the CPU
        policy_device=torch.device("cuda") if cfg.ray.collector_gpus else None,
        env_device="cpu", storing_device="cpu",
        ray_init_config={"address": "auto"},  # never used: Ray is already up (ray_session)
    )


class PrefetchingClient:
    """A replay-actor client for a learner rank that fetches ``chunk`` batches per call and keeps the next call in
    flight, so the rank computes while samples travel. One synchronous sample costs ~10 ms of Ray round trip here
    against 0.6 ms in-process (benchmarks/ray_vs_local.py), mostly per call, not per transition. Uniform batches
    drawn together are the same as batches drawn one by one; writes only happen between rounds, so only a round's
    first ``2 * chunk`` batches can miss the round's newest transitions. Everything but ``sample`` goes to torchrl's
    client unchanged."""

    def __init__(self, client, chunk: int):
        self._client, self._chunk = client, chunk
        self._pending = None  # the call in flight
        self._ready: deque = deque()
        self._batch_size = None

    def _request(self):
        return self._client._actor.sample.remote(self._batch_size * self._chunk)  # torchrl's client wraps the actor

    def sample(self, batch_size: int | None = None):
        import ray

        if batch_size != self._batch_size:
            self._pending, self._ready, self._batch_size = None, deque(), batch_size
        if not self._ready:
            chunk = ray.get(self._pending if self._pending is not None else self._request())
            self._ready.extend(chunk.split(batch_size))
            self._pending = self._request()
        return self._ready.popleft()

    def __getstate__(self):
        return {"client": self._client, "chunk": self._chunk}

    def __setstate__(self, state):
        self.__init__(state["client"], state["chunk"])

    def __getattr__(self, name: str):
        if name.startswith("__") or "_client" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._client, name)


def make_replay_buffer(cfg: DictConfig, run_dir=None):
    """The replay actor: a FIFO of ``replay.size`` transitions sampled uniformly, owned by Ray (0 CPUs reserved);
    its clients fetch ``ray.prefetch`` batches per call, ahead of use."""
    from torchrl.data import LazyTensorStorage, RandomSampler, RayReplayBuffer, TensorDictReplayBuffer

    class PrefetchingRayReplayBuffer(RayReplayBuffer):
        def client(self):
            return PrefetchingClient(super().client(), cfg.ray.prefetch)

    del run_dir  # memory storage only (checked in train.compose_config)
    replay_cls = PrefetchingRayReplayBuffer if cfg.ray.prefetch else RayReplayBuffer
    return replay_cls(replay_buffer_cls=TensorDictReplayBuffer, storage=partial(LazyTensorStorage, cfg.replay.size),
                      sampler=RandomSampler, batch_size=cfg.optim.batch_size, remote_config={"num_cpus": 0},
                      ray_init_config={"address": "auto"})


def learner_options(cfg: DictConfig) -> dict:
    """torchrl's ``learner_backend_options``: ranks, process-group backend, resources per rank and timeouts."""
    resources = {"num_cpus": cfg.ray.learner_cpus, "num_gpus": cfg.ray.learner_gpus}
    return {"world_size": cfg.ray.world_size, "backend": cfg.ray.backend, "resources_per_rank": resources,
            "setup_timeout": float(cfg.ray.setup_timeout_s), "command_timeout": float(cfg.ray.step_timeout_s),
            "store_host": "127.0.0.1" if cfg.ray.address is None else None}


class CheckedStepper:
    """An OptimizationStepper that checks each sample on the learner rank (the local engine checks the same in a
    trainer hook, which Ray learners do not run): ``check`` (shape and keys), and that no transition comes from a
    policy newer than this rank's; then runs ``inner``."""

    def __init__(self, inner, check, threads: int):
        from torchrl.trainers.trainers import DefaultOptimizationStepper

        self.inner = inner if inner is not None else DefaultOptimizationStepper()
        self.check = check
        self.threads = threads  # the rank's torch threads (Ray starts an actor with one per reserved CPU)
        self.updates_replay_priority = getattr(self.inner, "updates_replay_priority", False)

    def register(self, trainer, name: str = "optimization_stepper") -> None:
        self.inner.register(trainer, name)

    def _step(self, context, sample):
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)
        self.check(sample)
        newest = int(sample["next", "policy_version"].max())
        if newest > context.model_version:  # context: torchrl's learner on this rank
            raise InvariantError(f"sampled a transition of policy_version {newest} on a learner at version "
                                 f"{context.model_version}")
        return self.inner._step(context, sample)

    def state_dict(self) -> dict:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.inner.load_state_dict(state_dict)


def attach_learner_parts(cfg: DictConfig, trainer, parts) -> None:
    """Give the Ray learner ranks our optimisation stepper, wrapped in the per-rank sample check.

    torchrl 0.14.1's SACTrainer and DDPGTrainer do not pass an ``optimization_stepper`` on, so the ranks would get
    none (and no optimiser); the ranks are started later (``trainer.train``), from this object graph.
    """
    backend = trainer._execution_backend
    per_rank = cfg.optim.batch_size // cfg.ray.world_size
    if parts.stepper is not None:
        parts.stepper.write_priorities = False
    check = partial(check_sample_batch, shape=(per_rank,))
    backend.objects.optimization_stepper = CheckedStepper(parts.stepper, check, threads=cfg.threads)
    backend.update_replay_priority = False


class RayMonitor:
    """The Ray engine's per-round hook (after the learner steps and publishes): gathers the collector actors'
    rollout statistics, checks the invariants and logs ``train/`` ``loss/`` ``collector/`` ``replay/`` ``time/``.

    Invariants, each round:
    - transitions written to the replay actor == transitions collected, summed over the collector actors;
    - every transition of the round carries the version published before it, which equals the optimiser step count
      at that time (versions never decrease);
    - the learner ran ``steps_per_batch`` optimiser steps once replay held ``prefill_frames`` (0 before);
    - all metrics are finite (SharedLogger).
    """

    def __init__(self, cfg: DictConfig, trainer, logger, *, steps_per_batch: int, exploration_value, action_spec,
                 discrete: bool, start: dict):
        self.cfg, self.trainer, self.logger = cfg, trainer, logger
        self.steps_per_batch = steps_per_batch
        self.exploration_value = exploration_value
        bounded = not discrete and hasattr(action_spec, "space") and hasattr(action_spec.space, "low")
        self.low = action_spec.space.low.float() if bounded else None
        self.high = action_spec.space.high.float() if bounded else None
        self.batches = start.get("batches", 0)
        self.episodes = start.get("episodes", 0)
        self.start_elapsed_s = start.get("elapsed_s", 0.0)
        self.last_return: float | None = None
        self.collected = 0
        self.written_at_start = None
        self.version = trainer._optim_count  # the version published before the coming round
        self._t0 = self._t_round = time.perf_counter()
        self._last_log = -math.inf
        self._window = {"frames": 0, "optim": 0, "s": 0.0}

    @property
    def elapsed_s(self) -> float:
        return self.start_elapsed_s + time.perf_counter() - self._t0

    def progress(self) -> dict:
        """Counters for checkpoints and the summary."""
        return {"batches": self.batches, "episodes": self.episodes, "elapsed_s": self.elapsed_s,
                "last_return": self.last_return, "policy_version": self.version}

    def setup(self) -> None:
        """Before the first round (replay actor up, learner started and published)."""
        self.written_at_start = self.trainer.replay_buffer.write_count
        self._t_round = time.perf_counter()

    def __call__(self) -> None:
        trainer = self.trainer
        stats = trainer.collector.map_fn("post_collect_hook.drain")
        round_frames = sum(s["round_frames"] for s in stats)
        self.collected += round_frames
        written = trainer.replay_buffer.write_count - self.written_at_start
        if written != self.collected:
            raise InvariantError(f"replay received {written} transitions but the collectors collected "
                                 f"{self.collected}")
        for i, s in enumerate(stats):
            if s["round_frames"] and (s["version_lo"] != self.version or s["version_hi"] != self.version):
                raise InvariantError(f"round {self.batches}: collector {i} used policy_version "
                                     f"{s['version_lo']}..{s['version_hi']}; expected {self.version}")
        steps = trainer._optim_count - self.version
        # torchrl's Ray loop optimises once the run collected prefill_frames and replay holds a global batch
        optimised = (trainer.collected_frames >= self.cfg.collector.prefill_frames
                     and len(trainer.replay_buffer) >= self.cfg.optim.batch_size)
        if steps != (self.steps_per_batch if optimised else 0):
            raise InvariantError(f"round {self.batches} ran {steps} optimiser steps; expected "
                                 f"{self.steps_per_batch if optimised else 0}")
        learner_version = trainer._execution_backend.model_version
        if learner_version < self.version or trainer._published_model_version != learner_version:
            raise InvariantError(f"published policy version {trainer._published_model_version} vs learner "
                                 f"optimiser version {learner_version} (previous {self.version})")
        self.version = learner_version
        self.batches += 1
        self._log_round(stats, round_frames, steps)

    def _log_round(self, stats: list[dict], round_frames: int, steps: int) -> None:
        trainer = self.trainer
        frames = trainer.collected_frames
        now = time.perf_counter()
        self._window["frames"] += round_frames
        self._window["optim"] += steps
        self._window["s"] += now - self._t_round
        self._t_round = now
        returns = [r for s in stats for r in s["returns"]]
        if returns:
            lengths = [n for s in stats for n in s["lengths"]]
            self.episodes += len(returns)
            self.last_return = sum(returns) / len(returns)
            self.logger.log({"train/return": self.last_return, "train/episode_length": sum(lengths) / len(lengths),
                             "train/episodes": float(self.episodes)}, frames)
        # the trainer keeps every learner metric it received; the latest round's values are the last ones
        losses = {k: float(v[-1]) for k, v in trainer._log_dict.items() if v and k != "optim_steps"}
        trainer._log_dict.clear()
        if now - self._last_log < self.cfg.logger.interval_s:
            return
        self._last_log = now
        w, self._window = self._window, {"frames": 0, "optim": 0, "s": 0.0}
        m = {
            "train/frames": float(frames), "train/optim_steps": float(trainer._optim_count),
            "train/utd_ratio": trainer._optim_count / max(frames, 1), "train/exploration": self.exploration_value(),
            "collector/policy_version": float(self.version), "collector/actors": float(len(stats)),
            "collector/reward": sum(s["reward_sum"] for s in stats) / max(round_frames, 1),
            "replay/size": float(len(trainer.replay_buffer)), "replay/write_count": float(trainer.replay_buffer.write_count),
            "time/elapsed_s": self.elapsed_s, "time/cpu_s": time.process_time(),
            "time/sps": w["frames"] / max(w["s"], 1e-9), "time/updates_per_s": w["optim"] / max(w["s"], 1e-9),
        }
        actions = torch.cat([s["actions"] for s in stats])
        if actions.shape[0] > 1:
            m.update({f"collector/{k}": v for k, v in action_stats(actions, self.low, self.high).items()
                      if not k.startswith("action_std_")})
        m.update({f"loss/{k}": v for k, v in losses.items()})
        self.logger.log(m, frames)


class LearnerLost(RuntimeError):
    """The learner ranks are gone and the driver holds no copy of their state at the current frame count."""


class LearnerMirror:
    """The driver's copy of the Ray learner: every rank's state (networks, optimisers, stepper, target updater, RNG,
    via torchrl's backend) for checkpoints, and the policy weights for evaluation. A checkpoint needs a copy taken at
    the current frame count; after a rank died there is none, and the previous checkpoint stays the latest."""

    def __init__(self, trainer, policy):
        self.trainer = trainer
        self.backend = trainer._execution_backend
        self.policy = policy
        self.state: dict | None = None
        self.state_frames: int | None = None

    def refresh_policy(self) -> None:
        """Copy rank 0's current policy weights into the driver's policy."""
        self.backend.get_weights("policy").to_module(self.policy)

    def refresh(self) -> None:
        """Take the learner's state and policy now, if its ranks are up."""
        if self.backend.is_alive():
            self.state = self.backend.state_dict()
            self.state_frames = self.trainer.collected_frames
            self.refresh_policy()

    def state_dict(self) -> dict:
        self.refresh()
        if self.state_frames != self.trainer.collected_frames:
            raise LearnerLost(f"the learner ranks are gone; no learner state at {self.trainer.collected_frames} frames")
        return {"learner": _numpy_rng(self.state, to_tensor=True)}


def _numpy_rng(state: dict | None, *, to_tensor: bool) -> dict | None:
    """Each rank's numpy RNG state with its key array as a tensor (``torch.load(weights_only=True)`` refuses numpy
    arrays) or back."""
    import numpy as np

    if state is None:
        return None
    ranks = []
    for rank in state["ranks"]:
        name, keys, *rest = rank["rng"]["numpy"]
        keys = torch.from_numpy(keys.astype(np.int64)) if to_tensor else keys.numpy().astype(np.uint32)
        ranks.append({**rank, "rng": {**rank["rng"], "numpy": (name, keys, *rest)}})
    return {**state, "ranks": ranks}


class RestoreLearner:
    """Setup hook of a resumed Ray run: load the checkpoint's learner state into the started ranks and publish its
    policy (with its version) to the collectors before the first round."""

    def __init__(self, trainer, state: dict):
        self.trainer, self.state = trainer, state

    def __call__(self) -> None:
        self.trainer._execution_backend.load_state_dict(_numpy_rng(self.state, to_tensor=False))
        self.trainer._publish_execution_weights(force=True)


def describe_failure(exc: BaseException) -> str | None:
    """One line: which kind of actor failed and Ray's reason (None: not a Ray failure)."""
    import ray.exceptions

    text = " ".join(str(exc).split())
    if isinstance(exc, RuntimeError) and text.startswith("Ray learner generation is"):
        # torchrl's backend probes its ranks before each round; a dead rank shows up as this RuntimeError
        return f"a Ray learner rank died ({text})"
    if not isinstance(exc, ray.exceptions.RayError):
        return None
    if isinstance(exc, ray.exceptions.GetTimeoutError):
        return f"a Ray actor did not answer in time ({text[:300]})"
    if isinstance(exc, ray.exceptions.RayActorError):
        cls = re.search(r"class_name: (\S+)", text)
        pid = re.search(r"pid: (\d+)", text)
        cls = cls.group(1) if cls else "?"
        kind = "learner rank" if "Learner" in cls else "collector" if "Collector" in cls else "actor"
        return f"a Ray {kind} died ({cls}, pid {pid.group(1) if pid else '?'}): {text.split('.')[0]}"
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = " ".join(str(exc.cause).split()) if exc.cause is not None else text
        return f"a Ray task failed ({exc.function_name}): {cause[-300:]}"
    return f"Ray failure: {text[:300]}"
