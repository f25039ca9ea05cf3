"""The Ray engine (``engine=ray``): the loop's parts on a Ray cluster.

- collectors: ``ray.num_collectors`` actors (engines/ray_collectors.py), each the run's collector (the lean one for
  Gymnasium state-vector envs, else torchrl's ``Collector``) stepping ``env.num_envs`` envs; every rollout is
  flattened ``[B, T] -> [B*T]`` inside the actor and written straight into the replay actor, and the actor's
  ``RolloutStats`` keeps the round's statistics for the driver; a dead actor is replaced
  (``ray.max_collector_restarts``);
- replay: torchrl's ``RayReplayBuffer`` (one actor, 0 CPUs reserved: it only stores and samples);
- learner: ``ray.world_size`` :class:`LearnerRank` actors, each a :class:`offpolicy.learner.Learner` that samples
  ``batch_size / world_size`` per step from the replay actor and averages its gradients with the other ranks through
  ``torch.distributed`` (Gloo on CPU, NCCL with one GPU per rank) before each optimiser step. After a round, rank 0's
  policy weights come to the driver, which publishes them (with its exploration state) to the collectors.

Why our own rank actors rather than torchrl's ``Trainer(learner_backend="ray")``: that backend is reachable only
through the Trainer and its hooks (what this redesign removes), and its ranks ran torchrl's optimisation steppers,
which needed private attributes to carry our per-network optimisers; a rank here is the same Learner the local
engine runs.
"""
from __future__ import annotations

import contextlib
import datetime
import os
import re
import socket
from functools import partial

import torch
from omegaconf import DictConfig, OmegaConf
from tensordict import TensorDict

from offpolicy import prepare_process
from offpolicy.algos import AlgoParts
from offpolicy.builder import Builder
from offpolicy.collect.statistics import Rollout
from offpolicy.engines.base import Engine, LearnerLost, RunNeeds
from offpolicy.engines.ray_collectors import CollectorPool, CollectorsExhausted, ShareReplayBuffer
from offpolicy.envs import obs_norm_state
from offpolicy.invariants import InvariantError
from offpolicy.replay import n_step_transform
from shared import denormals
from shared.config import ConfigError
from shared.ray_start import init_ray


def start_ray(cfg: DictConfig) -> None:
    """Start Ray (local: bound to 127.0.0.1, no dashboard) or attach to ``ray.address``, then check that the job's
    resources exist (an actor that cannot be placed would wait forever). Ray is shut down again on any error."""
    local = {}
    if cfg.ray.address is None:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the learner ranks' Gloo sockets on loopback too
        local = {"num_cpus": cfg.ray.num_cpus, "num_gpus": cfg.ray.num_gpus}
    init_ray(cfg.ray.address, address_key="ray.address", needed_by="engine=ray", instead="engine=local",
             log_to_driver=cfg.ray.log_to_driver, **local)
    import ray  # installed: init_ray said so

    have = ray.cluster_resources()
    need = RayEngine.resources(cfg)
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if v > have.get(k, 0.0) + 1e-9}
    if short:
        ray.shutdown()
        what = ", ".join(f"{v:g} {k} (cluster has {h:g})" for k, (v, h) in short.items())
        raise ConfigError(f"ray: the job needs {what}; allowed: fewer ray.num_collectors / ray.world_size, "
                          "smaller ray.collector_cpus / learner_cpus / *_gpus, or a bigger cluster")


def make_replay_actor(cfg: DictConfig):
    """The replay actor: a FIFO of ``replay.size`` transitions sampled uniformly, owned by Ray (0 CPUs reserved),
    that knows which collector actor wrote which round's share (:class:`ShareReplayBuffer`)."""
    from torchrl.data import LazyTensorStorage, RandomSampler, RayReplayBuffer

    return RayReplayBuffer(replay_buffer_cls=ShareReplayBuffer,
                           storage=partial(LazyTensorStorage, cfg.replay.size), sampler=RandomSampler,
                           transform=n_step_transform(cfg),
                           remote_config={"num_cpus": 0}, ray_init_config={"address": "auto"})


class Specs:
    """The training env's specs without the env (what an algorithm's builder reads), to ship to the learner ranks."""

    def __init__(self, env):
        self.observation_spec_unbatched = env.observation_spec_unbatched
        self.action_spec_unbatched = env.action_spec_unbatched


class LearnerRank:
    """One learner rank (a Ray actor): the algorithm's parts and a :class:`Learner` whose gradients are averaged
    over the ranks (torch.distributed all-reduce, what DDP does) before every optimiser step. Networks start equal
    on every rank (same seed) and stay equal."""

    def __init__(self, cfg: dict, specs: Specs, replay, rank: int, world_size: int, seed: int):
        prepare_process()  # the actor's process: a Ray worker that ran none of our code before
        cfg = OmegaConf.create(cfg)
        # Ray starts an actor with one thread per reserved CPU
        denormals.start_intra_op_threads(RayEngine.learner_threads(cfg))
        torch.manual_seed(cfg.seed)  # the same initial networks on every rank
        self.rank, self.world_size = rank, world_size
        self.device = RayEngine.learner_device(cfg)
        builder = Builder(cfg)
        self.parts: AlgoParts = builder.parts(specs, self.device)
        self.parts.loss.to(self.device)
        self.replay = replay
        self.learner = builder.learner(self.parts, specs.action_spec_unbatched, world_size=world_size,
                                       grad_sync=rank_sync(self.parts.loss, world_size) if world_size > 1 else None,
                                       chunk=max(cfg.ray.prefetch, 1), device=self.device,
                                       overlap_sampling=True)  # the replay actor's round trips hide behind learning
        # each rank draws its own samples and noise, from the run's seed (a resumed run's is new: new draws)
        torch.manual_seed(seed + 1 + rank)
        self.backend = cfg.ray.backend
        self.timeout = datetime.timedelta(seconds=cfg.ray.setup_timeout_s)

    def address(self) -> tuple[str, int]:
        """Where rank 0 listens for the process group's rendezvous: this node's address and a free port."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return ray.util.get_node_ip_address(), port

    def connect(self, host: str, port: int) -> None:
        import torch.distributed as dist

        dist.init_process_group(self.backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size, timeout=self.timeout)

    def update(self, n_steps: int, version: int) -> tuple[dict[str, float], int]:
        return self.learner.update(self.replay, n_steps, version), self.learner.steps

    def policy_weights(self) -> TensorDict:
        """The deterministic policy's weights (on the CPU), for the collectors and the evaluator."""
        return TensorDict.from_module(self.parts.eval_policy).data.to("cpu").clone()

    def state_dict(self) -> dict:
        return _to_cpu(self.learner.state_dict())

    def load_state_dict(self, state: dict) -> None:
        self.learner.load_state_dict(state)


def average_gradients(params: list[torch.Tensor], world_size: int, buffers: list[torch.Tensor] = ()) -> None:
    """Replace each parameter's gradient by its mean over the ``world_size`` ranks of the default process group (what
    DDP does), and each of ``buffers`` (running statistics) by its mean in place, in one all-reduce. A parameter
    without a gradient keeps none, as in the local engine (every rank runs the same loss, so the same ones lack it):
    a zero there would still move it through Adam's momentum."""
    import torch.distributed as dist

    with_grad = [p for p in params if p.grad is not None]
    if not with_grad and not buffers:
        return
    flat = torch.cat([p.grad.reshape(-1) for p in with_grad] + [b.reshape(-1) for b in buffers])
    dist.all_reduce(flat)
    flat /= world_size
    offset = 0
    for p in with_grad:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p)
        offset += n
    for b in buffers:
        n = b.numel()
        b.copy_(flat[offset:offset + n].view_as(b))
        offset += n


def rank_sync(loss, world_size: int):
    """A learner rank's ``grad_sync``: the gradients and the loss's running statistics (CrossQ's batch
    renormalisation, which every rank's forward moves with its own samples) averaged over the ranks on every step, so
    the ranks keep equal networks."""
    from offpolicy.algos.networks import running_statistics

    return partial(average_gradients, world_size=world_size, buffers=running_statistics(loss))


def _to_cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.cpu()
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    return tree


class RayEngine(Engine):
    """Collector actors, a replay actor and learner ranks on Ray; the driver keeps the collection policy (and its
    exploration state) and the evaluation policy, refreshed from rank 0 after every round."""

    replay_in_process = False  # a replay actor, written by every collector actor

    @classmethod
    def check_config(cls, cfg: DictConfig) -> None:
        """What the Ray engine needs on top of the local checks."""
        super().check_config(cfg)
        ray_cfg = cfg.ray
        if cfg.collector.overlap:
            raise ConfigError("collector.overlap=true is not allowed with engine=ray; allowed: false (the Ray "
                              "collectors are processes of their own already)")
        if cfg.optim.batch_size % ray_cfg.world_size:
            raise ConfigError(f"optim.batch_size={cfg.optim.batch_size} is not allowed; allowed: a multiple of "
                              f"ray.world_size={ray_cfg.world_size} (the global batch is split evenly over the ranks)")
        per_round = ray_cfg.num_collectors * cfg.env.num_envs
        if cfg.collector.env_steps_per_batch % per_round:
            raise ConfigError(f"collector.env_steps_per_batch={cfg.collector.env_steps_per_batch} is not allowed; "
                              f"allowed: a multiple of ray.num_collectors * env.num_envs = {per_round}")
        if ray_cfg.backend == "nccl" and (ray_cfg.learner_gpus < 1 or not float(ray_cfg.learner_gpus).is_integer()):
            raise ConfigError(f"ray.learner_gpus={ray_cfg.learner_gpus} is not allowed with ray.backend=nccl; "
                              "allowed: a whole number >= 1 (NCCL needs one GPU per rank)")
        if ray_cfg.backend == "gloo" and ray_cfg.learner_gpus:
            raise ConfigError(f"ray.learner_gpus={ray_cfg.learner_gpus} is not allowed with ray.backend=gloo; "
                              "allowed: 0 (or ray.backend=nccl)")
        local_only = {"replay.storage": (cfg.replay.storage, "memory"),
                      "replay.prioritized": (cfg.replay.prioritized, False),
                      "replay.slice_len": (cfg.replay.slice_len, None),
                      "replay.in_checkpoint": (cfg.replay.in_checkpoint, False)}
        for key, (value, allowed) in local_only.items():
            if value != allowed:
                raise ConfigError(f"{key}={value!r} is not allowed with engine=ray; allowed: "
                                  f"{str(allowed).lower() if allowed is not None else 'null'} (the Ray replay actor "
                                  "is a uniform in-memory FIFO)")

    @staticmethod
    def resources(cfg: DictConfig) -> dict[str, float]:
        """CPUs and GPUs the job reserves: collectors and learner ranks (the replay actor asks for none)."""
        r = cfg.ray
        return {"CPU": r.num_collectors * r.collector_cpus + r.world_size * r.learner_cpus,
                "GPU": r.num_collectors * r.collector_gpus + r.world_size * r.learner_gpus}

    @staticmethod
    def learner_cores(cfg: DictConfig) -> int:
        """The CPUs Ray reserves for each rank (``ray.learner_cpus``)."""
        return max(1, int(cfg.ray.learner_cpus))

    @staticmethod
    def learner_device(cfg: DictConfig) -> torch.device:
        """CUDA with ``ray.backend=nccl`` (one GPU per rank), the CPU with Gloo."""
        return torch.device("cuda" if cfg.ray.backend == "nccl" else "cpu")

    @staticmethod
    def learner_ranks(cfg: DictConfig) -> int:
        return cfg.ray.world_size

    @staticmethod
    def collectors(cfg: DictConfig) -> int:
        return cfg.ray.num_collectors

    @staticmethod
    def collects_on_cpu(cfg: DictConfig) -> bool:
        """Unless the collector actors have GPUs (``ray.collector_gpus``): then their policy runs there."""
        return not cfg.ray.collector_gpus

    @classmethod
    def plan(cls, cfg: DictConfig) -> dict:
        r = cfg.ray
        return {"collectors": r.num_collectors, "learner_ranks": r.world_size, "learner_backend": r.backend,
                "collector_cpus": r.collector_cpus, "collector_gpus": r.collector_gpus,
                "learner_gpus": r.learner_gpus, "resources": cls.resources(cfg), "ray_actors": True}

    @classmethod
    def run_needs(cls, cfg: DictConfig) -> RunNeeds:
        """The driver's threads (a learner rank's), the learner's device, one env copy (the driver reads its specs and
        statistics; the collector actors build their own copies); Ray starts its processes itself."""
        return RunNeeds(threads=cls.learner_threads(cfg), device=cls.learner_device(cfg), env_copies=1)

    @staticmethod
    def describe_failure(exc: BaseException) -> str | None:
        return describe_ray_failure(exc)

    def __init__(self, builder: Builder, env, parts: AlgoParts, run_dir, seed: int):
        import ray

        cfg = builder.cfg
        start_ray(cfg)
        self.cfg, self.parts = cfg, parts
        self.timeout = float(cfg.ray.step_timeout_s)
        self.replay = self.collectors = None
        self.ranks = []
        try:
            self.replay = make_replay_actor(cfg)
            self.collectors = CollectorPool(cfg, parts.collect_policy, self.replay, obs_norm_state(env), seed)
            rank_cls = ray.remote(num_cpus=cfg.ray.learner_cpus, num_gpus=cfg.ray.learner_gpus)(LearnerRank)
            config = OmegaConf.to_container(cfg, resolve=True)
            self.ranks = [rank_cls.remote(config, Specs(env), self.replay.client(), rank, cfg.ray.world_size, seed)
                          for rank in range(cfg.ray.world_size)]
            setup = float(cfg.ray.setup_timeout_s)
            try:
                host, port = self._get(self.ranks[0].address.remote(), setup)
                if cfg.ray.address is None:
                    host = "127.0.0.1"
                self._get([r.connect.remote(host, port) for r in self.ranks], setup)
            except ray.exceptions.GetTimeoutError:
                raise ConfigError(f"ray.setup_timeout_s={cfg.ray.setup_timeout_s:g}: the learner ranks did not start "
                                  "and connect within it (a busy or small machine); allowed: a larger "
                                  "ray.setup_timeout_s") from None
        except BaseException:
            self.close()
            raise
        finally:
            env.close()  # the driver's copy gave its specs and statistics; the collector actors step their own

    def describe(self) -> str:
        c = self.cfg
        return (f"Ray: {c.ray.num_collectors} collector actors x {c.env.num_envs} envs, {c.ray.world_size} "
                f"{c.ray.backend} learner ranks x {c.optim.batch_size // c.ray.world_size} samples; ")

    @staticmethod
    def _get(refs, timeout: float):
        import ray

        return ray.get(refs, timeout=timeout)

    def collect(self) -> Rollout:
        return self.collectors.round()  # the actors write into the replay actor themselves

    def replay_size(self) -> int:
        return len(self.replay)

    def replay_writes(self) -> int:
        return self.replay.write_count

    def update(self, n_steps: int, version: int, stop=None) -> tuple[dict[str, float], int]:
        # a round runs in the ranks as one call: a stop-now takes effect after it (within ray.step_timeout_s)
        results = self._get([r.update.remote(n_steps, version) for r in self.ranks], self.timeout)
        steps = {s for _, s in results}
        if len(steps) != 1:
            raise InvariantError(f"learner ranks disagree on their optimiser steps: {sorted(steps)}")
        metrics = {k: sum(m[k] for m, _ in results) / len(results) for k in results[0][0]}
        return metrics, steps.pop()

    def publish(self) -> int:
        """Send rank 0's policy to the collectors; returns the version the collector actors report (the lowest, so
        an actor that missed a publication breaks the round invariant)."""
        weights = self._get(self.ranks[0].policy_weights.remote(), self.timeout)
        weights.to_module(self.parts.eval_policy)  # also the actor inside the collection policy
        return self.collectors.publish(TensorDict.from_module(self.parts.collect_policy).data)

    def learner_state(self) -> dict:
        """Rank 0's learner state, after checking that every rank holds the same networks (what gradient
        averaging promises)."""
        import ray.exceptions

        try:
            states = self._get([r.state_dict.remote() for r in self.ranks], self.timeout)
        except ray.exceptions.RayError as exc:
            raise LearnerLost(f"the learner ranks are gone ({type(exc).__name__})") from None
        first = states[0]["loss"]
        for rank, state in enumerate(states[1:], start=1):
            if any(not torch.equal(first[k], state["loss"][k]) for k in first):
                raise InvariantError(f"learner rank {rank}'s networks differ from rank 0's")
        return states[0]

    def restore(self, learner_state: dict, version: int) -> None:
        self._get([r.load_state_dict.remote(learner_state) for r in self.ranks], self.timeout)
        self.parts.loss.load_state_dict(learner_state["loss"])
        self.collectors.restore(TensorDict.from_module(self.parts.collect_policy).data, version)

    def collector_restarts(self) -> int:
        return self.collectors.restarts if self.collectors is not None else 0

    def replay_state(self) -> dict | None:
        return None  # the replay actor is not checkpointed (replay.in_checkpoint is refused with engine=ray)

    def restore_replay(self, state: dict) -> None:
        raise ConfigError("replay.in_checkpoint=true is not allowed with engine=ray; allowed: false")

    def close(self) -> None:
        import ray

        with contextlib.suppress(Exception):
            if self.collectors is not None:
                self.collectors.close()
        with contextlib.suppress(Exception):
            if self.replay is not None:
                self.replay.close()
        ray.shutdown()


def describe_ray_failure(exc: BaseException) -> str | None:
    """One line: which kind of actor failed and Ray's reason (None: not a Ray failure)."""
    import ray.exceptions

    note = f"; {exc}" if isinstance(exc, CollectorsExhausted) else ""
    # the Ray error itself, or the one a wrapper (torchrl's collectors) raised its own error from
    while exc is not None and not isinstance(exc, ray.exceptions.RayError):
        exc = exc.__cause__ or exc.__context__
    if exc is None:
        return None
    text = " ".join(str(exc).split())
    if isinstance(exc, ray.exceptions.GetTimeoutError):
        return f"a Ray actor did not answer in time ({text[:300]})"
    if isinstance(exc, ray.exceptions.RayActorError):
        cls = re.search(r"class_name: (\S+)", text)
        pid = re.search(r"pid: (\d+)", text)
        cls = cls.group(1) if cls else "?"
        kind = "learner rank" if "LearnerRank" in cls else "collector" if "Collector" in cls else "actor"
        return f"a Ray {kind} died ({cls}, pid {pid.group(1) if pid else '?'}): {text.split('.')[0]}{note}"
    if isinstance(exc, ray.exceptions.RayTaskError):
        cause = " ".join(str(exc.cause).split()) if exc.cause is not None else text
        return f"a Ray task failed ({exc.function_name}): {cause[-300:]}"
    return f"Ray failure: {text[:300]}"
