"""Entry point of the off-policy engine: ``python -m offpolicy.train algo=dqn|sac|ddpg|td3 [env=...] [key=value...]``.

One loop, torchrl's: the algorithm's ``*Trainer`` collects a batch, writes it (flattened) into replay, runs
``utd_ratio * frames_per_batch`` optimiser steps and publishes the weights to the collector. This file builds the
parts (algorithms.py: which; engine.py: where they run) and registers the hooks around that loop: prefill,
invariants, metrics, exploration annealing, asynchronous evaluation and checkpoints.
"""
from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from offpolicy import engine, ray_engine
from offpolicy.algorithms import ACTIVATIONS, ALGOS, AlgoParts, build_parts
from offpolicy.evaluate import AsyncEvaluator
from offpolicy.invariants import InvariantError, Invariants
from offpolicy.metrics import Metrics, SharedLogger
from shared.checkpoint import load_checkpoint, save_checkpoint
from shared.config import (CONFIG_ROOT, ConfigError, Group, Rule, compose, help_text, make_run_dir,
                           parse_overrides, run_cli)
from shared.envs import check_gym_name
from shared.logging import BACKENDS, make_logger
from shared.plots import plot_curves

CONFIG_DIR = CONFIG_ROOT / "offpolicy"
ALIASES = {"env": "env.name", "lr": "optim.lr", "utd": "optim.utd_ratio"}
GROUPS = (Group("algo", may_add_keys=True), Group("profile"))
USAGE = ("usage: python -m offpolicy.train algo=dqn|sac|ddpg|td3 [env=NAME] [profile=smoke|local|ray_smoke|...] "
         "[engine=local|ray] [run_dir=PATH] [resume=CHECKPOINT] [key=value ...]")
EXIT_INVARIANT = 3
EXIT_FAILED = 4
EXIT_INTERRUPTED = 130


def _positive_ints(key):
    def check(value):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            raise ConfigError(f"{key}={value!r} is not allowed; allowed: a non-empty list of positive integers")
    return check


RULES = {
    "env.num_envs": Rule(min=1, integer=True),
    "total_frames": Rule(min=1, integer=True),
    "seed": Rule(min=0, integer=True),
    "threads": Rule(min=1, integer=True),
    "collector.frames_per_batch": Rule(min=1, integer=True),
    "collector.prefill_frames": Rule(min=0, integer=True),
    "model.hidden": Rule(check=_positive_ints("model.hidden")),
    "model.activation": Rule(choices=tuple(ACTIVATIONS)),
    "optim.utd_ratio": Rule(min=1e-9),
    "optim.batch_size": Rule(min=1, integer=True),
    "optim.lr": Rule(min=1e-12),
    "optim.critic_lr": Rule(min=1e-12),
    "optim.weight_decay": Rule(min=0),
    "optim.critic_weight_decay": Rule(min=0),
    "optim.max_grad_norm": Rule(min=1e-12, nullable=True),
    "optim.critic_max_grad_norm": Rule(min=1e-12, nullable=True),
    "loss.value_estimator": Rule(choices=("td0", "td1", "tdlambda")),
    "loss.gamma": Rule(min=0, max=1),
    "loss.lmbda": Rule(min=0, max=1),
    "loss.function": Rule(choices=("l2", "smooth_l1")),
    "target.mode": Rule(choices=("soft", "hard")),
    "target.tau": Rule(min=1e-9, max=0.5),
    "target.hard_every": Rule(min=1, integer=True),
    "replay.size": Rule(min=1, integer=True),
    "replay.storage": Rule(choices=("memory", "memmap")),
    "replay.alpha": Rule(min=0),
    "replay.beta": Rule(min=0),
    "replay.slice_len": Rule(min=2, integer=True, nullable=True),
    "env.vector": Rule(choices=("serial", "process")),
    "env.image_size": Rule(min=36, integer=True),
    "env.obs_norm_init_steps": Rule(min=2, integer=True),
    "eval.interval_frames": Rule(min=0, integer=True),
    "eval.episodes": Rule(min=1, integer=True),
    "eval.final_episodes": Rule(min=0, integer=True),
    "eval.max_episode_steps": Rule(min=1, integer=True),
    "logger.backend": Rule(choices=BACKENDS),
    "logger.interval_s": Rule(min=0),
    "checkpoint.interval_s": Rule(min=0),
    "invariants.check_every": Rule(min=1, integer=True),
    "optim.replay_ratio": Rule(min=1e-12, nullable=True),
    "engine": Rule(choices=("local", "ray")),
    "ray.num_cpus": Rule(min=1, integer=True, nullable=True),
    "ray.num_gpus": Rule(min=0, integer=True, nullable=True),
    "ray.num_collectors": Rule(min=1, integer=True),
    "ray.collector_cpus": Rule(min=0),
    "ray.collector_gpus": Rule(min=0),
    "ray.world_size": Rule(min=1, integer=True),
    "ray.backend": Rule(choices=("gloo", "nccl")),
    "ray.learner_cpus": Rule(min=0),
    "ray.learner_gpus": Rule(min=0),
    "ray.prefetch": Rule(min=0, integer=True),
    "ray.setup_timeout_s": Rule(min=1),
    "ray.step_timeout_s": Rule(min=1),
}
_NOISE = {"noise": Rule(choices=("gaussian", "ou")), "sigma": Rule(min=1e-9), "sigma_end": Rule(min=0),
          "anneal_frames": Rule(min=1, integer=True)}
ALGO_RULES = {
    "dqn": {"dqn.eps_init": Rule(min=0, max=1), "dqn.eps_end": Rule(min=0, max=1),
            "dqn.eps_anneal_frames": Rule(min=1, integer=True)},
    "sac": {"sac.alpha_init": Rule(min=1e-9), "sac.alpha_lr": Rule(min=1e-12)},
    "ddpg": {**{f"ddpg.{k}": r for k, r in _NOISE.items()},
             "ddpg.noise": Rule(choices=("gaussian", "ou", "none"))},
    "td3": {**{f"td3.{k}": r for k, r in _NOISE.items()}, "td3.policy_delay": Rule(min=1, integer=True),
            "td3.target_noise": Rule(min=0), "td3.noise_clip": Rule(min=0)},
}


def compose_config(argv: list[str]) -> tuple[DictConfig, dict | None]:
    """Compose and validate the config; with ``resume=PATH`` the checkpoint's config is the base. Returns
    ``(cfg, checkpoint or None)``."""
    overrides = parse_overrides(argv, ALIASES)
    checkpoint = load_checkpoint(overrides["resume"]) if overrides.get("resume") not in (None, "", "null") else None
    base = checkpoint["config"] if checkpoint is not None else None
    if base is not None and overrides.get("algo", base["algo"]) != base["algo"]:
        raise ConfigError(f"algo={overrides['algo']!r} differs from the resumed run's; allowed: {base['algo']}")
    cfg = compose(CONFIG_DIR, overrides, groups=GROUPS, rules=RULES, base=base)
    if cfg.algo not in ALGOS:
        raise ConfigError(f"algo={cfg.algo!r} is not allowed; allowed: {', '.join(ALGOS)}")
    for key, rule in ALGO_RULES[cfg.algo].items():
        rule.validate(key, OmegaConf.select(cfg, key))
    if engine.is_atari(cfg):
        if cfg.algo != "dqn":
            raise ConfigError(f"env.name={cfg.env.name!r} is an ALE game; allowed for {cfg.algo}: a continuous-action "
                              "Gymnasium id (HalfCheetah-v5, Pendulum-v1, Hopper-v5, Humanoid-v5)")
    else:
        check_gym_name(cfg.env.name)
    steps = cfg.optim.utd_ratio * cfg.collector.frames_per_batch
    if abs(steps - round(steps)) > 1e-6 or round(steps) < 1:
        raise ConfigError(f"optim.utd_ratio={cfg.optim.utd_ratio} gives {steps:g} optimiser steps per batch of "
                          f"collector.frames_per_batch={cfg.collector.frames_per_batch}; allowed: a utd_ratio that "
                          "makes it a positive integer")
    if cfg.collector.frames_per_batch % cfg.env.num_envs:
        raise ConfigError(f"collector.frames_per_batch={cfg.collector.frames_per_batch} is not allowed; allowed: a "
                          f"multiple of env.num_envs={cfg.env.num_envs}")
    if not cfg.optim.batch_size <= max(cfg.collector.prefill_frames, cfg.collector.frames_per_batch):
        raise ConfigError(f"optim.batch_size={cfg.optim.batch_size} is not allowed; allowed: <= "
                          "max(collector.prefill_frames, collector.frames_per_batch), so the first sample can be drawn")
    if cfg.replay.slice_len and cfg.optim.batch_size % cfg.replay.slice_len:
        raise ConfigError(f"replay.slice_len={cfg.replay.slice_len} is not allowed; allowed: a divisor of "
                          f"optim.batch_size={cfg.optim.batch_size} (each step replays batch_size transitions)")
    if cfg.loss.value_estimator != "td0" and not cfg.replay.slice_len:
        raise ConfigError(f"loss.value_estimator={cfg.loss.value_estimator} is not allowed without "
                          "replay.slice_len; allowed: td0, or set replay.slice_len so targets run along trajectories")
    if cfg.env.from_pixels and cfg.env.obs_norm:
        raise ConfigError("env.obs_norm=true is not allowed with env.from_pixels=true; allowed: obs_norm for state "
                          "observations (images are scaled by 1/255 in the encoder)")
    if cfg.collector.prefill_frames > cfg.replay.size:
        raise ConfigError(f"collector.prefill_frames={cfg.collector.prefill_frames} is not allowed; allowed: <= "
                          f"replay.size={cfg.replay.size}")
    ratio = cfg.optim.batch_size * cfg.optim.utd_ratio
    if cfg.optim.replay_ratio is not None and abs(ratio - cfg.optim.replay_ratio) > 1e-6 * ratio:
        raise ConfigError(f"optim.replay_ratio={cfg.optim.replay_ratio} is not allowed; allowed: optim.batch_size * "
                          f"optim.utd_ratio = {ratio:g} (or null)")
    if cfg.engine == "ray":
        _check_ray(cfg)
    return cfg, checkpoint


def _check_ray(cfg: DictConfig) -> None:
    """What the Ray engine needs on top of the local checks."""
    ray_cfg = cfg.ray
    if cfg.optim.batch_size % ray_cfg.world_size:
        raise ConfigError(f"optim.batch_size={cfg.optim.batch_size} is not allowed; allowed: a multiple of "
                          f"ray.world_size={ray_cfg.world_size} (the global batch is split evenly over the ranks)")
    per_round = ray_cfg.num_collectors * cfg.env.num_envs
    if cfg.collector.frames_per_batch % per_round:
        raise ConfigError(f"collector.frames_per_batch={cfg.collector.frames_per_batch} is not allowed; allowed: a "
                          f"multiple of ray.num_collectors * env.num_envs = {per_round}")
    if ray_cfg.backend == "nccl" and (ray_cfg.learner_gpus < 1 or not float(ray_cfg.learner_gpus).is_integer()):
        raise ConfigError(f"ray.learner_gpus={ray_cfg.learner_gpus} is not allowed with ray.backend=nccl; allowed: a "
                          "whole number >= 1 (NCCL needs one GPU per rank)")
    if ray_cfg.backend == "gloo" and ray_cfg.learner_gpus:
        raise ConfigError(f"ray.learner_gpus={ray_cfg.learner_gpus} is not allowed with ray.backend=gloo; allowed: 0 "
                          "(or ray.backend=nccl)")
    local_only = {"replay.storage": (cfg.replay.storage, "memory"), "replay.prioritized": (cfg.replay.prioritized, False),
                  "replay.slice_len": (cfg.replay.slice_len, None),
                  "replay.in_checkpoint": (cfg.replay.in_checkpoint, False)}
    for key, (value, allowed) in local_only.items():
        if value != allowed:
            raise ConfigError(f"{key}={value!r} is not allowed with engine=ray; allowed: "
                              f"{str(allowed).lower() if allowed is not None else 'null'} (the Ray replay actor is a "
                              "uniform in-memory FIFO)")


def _check_action_space(cfg: DictConfig, env) -> None:
    from torchrl.data import Bounded, OneHot

    spec = env.action_spec_unbatched
    if cfg.algo == "dqn" and not isinstance(spec, OneHot):
        raise ConfigError(f"env.name={cfg.env.name!r} has continuous actions; allowed for dqn: a discrete-action "
                          "env (CartPole-v1, an ALE game such as Pong)")
    if cfg.algo != "dqn" and not isinstance(spec, Bounded):
        raise ConfigError(f"env.name={cfg.env.name!r} has no bounded continuous actions; allowed for {cfg.algo}: "
                          "HalfCheetah-v5, Pendulum-v1, Hopper-v5, Humanoid-v5 or another Box-action env")


class PrefillGate:
    """No optimiser step until replay holds ``prefill_frames`` transitions of the collection policy. torchrl's
    Trainer only offers ``init_random_frames`` (random actions), which the design rules out."""

    def __init__(self, trainer, prefill_frames: int, steps_per_batch: int):
        self.trainer = trainer
        self.prefill_frames = prefill_frames
        self.steps_per_batch = steps_per_batch

    def __call__(self, batch):
        ready = len(self.trainer.replay_buffer) + batch.numel() >= self.prefill_frames  # written before optimising
        self.trainer.optim_steps_per_batch = self.steps_per_batch if ready else 0
        return batch


class AnnealExploration:
    """Steps the exploration module by the frames collected since the last call (torchrl's TD3Trainer and our
    DDPG trainer never anneal it; DQNTrainer anneals its epsilon-greedy module itself)."""

    def __init__(self, trainer, module):
        self.trainer = trainer
        self.module = module
        self.last = trainer.collected_frames

    def __call__(self) -> None:
        delta = self.trainer.collected_frames - self.last
        self.last = self.trainer.collected_frames
        if delta > 0:
            self.module.step(delta)


class PeriodicEval:
    """Submits the deterministic policy's weights to the evaluator every ``interval`` frames (``refresh`` first
    brings the driver's copy of the policy up to date: the Ray learner trains elsewhere)."""

    def __init__(self, trainer, evaluator: AsyncEvaluator, policy, interval: int, refresh=None):
        self.trainer, self.evaluator, self.policy, self.interval = trainer, evaluator, policy, interval
        self.refresh = refresh
        self.next = (trainer.collected_frames // interval + 1) * interval

    def __call__(self) -> None:
        if self.trainer.collected_frames >= self.next:
            if self.refresh is not None:
                self.refresh()
            self.evaluator.submit(self.trainer.collected_frames, self.policy)
            self.next = (self.trainer.collected_frames // self.interval + 1) * self.interval


def local_learner_state(trainer, parts: AlgoParts) -> dict:
    """The in-process learner's checkpoint state: networks, optimisers, stepper and target-update counters."""
    return {
        "loss": parts.loss.state_dict(),
        "optimizers": {name: opt.state_dict() for name, opt in parts.optimizers.items()},
        "stepper": trainer.optimization_stepper.state_dict() if trainer.optimization_stepper else None,
        "target_updates": parts.target_updater.updates,
    }


class Checkpointer:
    """Atomic checkpoints (``checkpoints/last.pt``) of everything a resume needs: the learner's state
    (``learner_state()``), the run's counters (``progress()``), exploration, observation statistics, replay, RNG."""

    def __init__(self, cfg: DictConfig, run_dir: Path, trainer, parts: AlgoParts, progress, learner_state,
                 obs_norm: dict | None):
        self.cfg, self.trainer, self.parts = cfg, trainer, parts
        self.progress, self.learner_state = progress, learner_state
        self.obs_norm = obs_norm
        self.path = run_dir / "checkpoints" / "last.pt"
        self.interval_s = cfg.checkpoint.interval_s
        self._last = time.monotonic()

    def maybe_save(self) -> None:
        if self.interval_s and time.monotonic() - self._last >= self.interval_s:
            self.save()

    def save(self) -> Path:
        trainer, parts, progress = self.trainer, self.parts, self.progress()
        state = {
            "config": OmegaConf.to_container(self.cfg, resolve=True),
            "counters": {"collected_frames": trainer.collected_frames, "optim_steps": trainer._optim_count,
                         "batches": progress["batches"], "episodes": progress["episodes"],
                         "elapsed_s": progress["elapsed_s"]},
            **self.learner_state(),
            "exploration": parts.exploration.state_dict() if parts.exploration is not None else None,
            "obs_norm": self.obs_norm,
            "replay": (engine.replay_state(self.cfg, trainer.replay_buffer)
                       if self.cfg.replay.in_checkpoint or self.cfg.replay.storage == "memmap" else None),
            "rng": torch.get_rng_state(),
        }
        save_checkpoint(self.path, state)
        self._last = time.monotonic()
        return self.path


def _restore(cfg: DictConfig, checkpoint: dict, trainer, parts: AlgoParts, run_dir: Path) -> None:
    """Load a checkpoint's weights, optimisers, exploration state, counters and (if saved) replay. A Ray learner's
    state is loaded when its ranks have started (:class:`ray_engine.RestoreLearner`)."""
    if cfg.engine == "local":
        parts.loss.load_state_dict(checkpoint["loss"])
        for name, opt in parts.optimizers.items():
            opt.load_state_dict(checkpoint["optimizers"][name])
        if checkpoint["stepper"] is not None:
            trainer.optimization_stepper.load_state_dict(checkpoint["stepper"])
        parts.target_updater.updates = checkpoint["target_updates"]
    if parts.exploration is not None:
        parts.exploration.load_state_dict(checkpoint["exploration"])
    if checkpoint["replay"] is not None:
        engine.restore_replay(cfg, trainer.replay_buffer, checkpoint["replay"], run_dir)
    counters = checkpoint["counters"]
    trainer.collected_frames = counters["collected_frames"]
    trainer._optim_count = counters["optim_steps"]
    if cfg.engine == "local":
        trainer.collector.policy_version_tracker.version = counters["batches"]
    if hasattr(trainer, "_greedy_last_frames"):  # DQNTrainer anneals epsilon by frames since this mark
        trainer._greedy_last_frames = counters["collected_frames"]
    torch.set_rng_state(checkpoint["rng"])


def _env_tag(name: str) -> str:
    return name.replace("/", "_")


def _build_engine(cfg: DictConfig, env, parts: AlgoParts, run_dir: Path):
    """The collector, replay buffer and trainer of ``cfg.engine``: in this process, or Ray actors and learner ranks."""
    if cfg.engine == "ray":
        replay = ray_engine.make_replay_buffer(cfg)
        collector = ray_engine.make_collector(cfg, parts.collect_policy, replay, engine.obs_norm_state(env))
        trainer = engine.make_trainer(cfg, parts, collector, replay, ray_engine.learner_options(cfg))
        ray_engine.attach_learner_parts(cfg, trainer, parts)
        # torchrl's Ray loop optimises once collected_frames >= the collector's init_random_frames; the actors
        # themselves got 0 (no random-action prefill)
        collector.init_random_frames = cfg.collector.prefill_frames
    else:
        collector = engine.make_collector(cfg, env, parts.collect_policy)
        replay = engine.make_replay_buffer(cfg, run_dir)
        trainer = engine.make_trainer(cfg, parts, collector, replay)
    return collector, replay, trainer


def train(cfg: DictConfig, checkpoint: dict | None = None) -> dict:
    """Run one training job described by ``cfg``; returns the summary (also written to ``summary.json``)."""
    if cfg.engine == "ray":
        with ray_engine.ray_session(cfg):
            return _train(cfg, checkpoint)
    return _train(cfg, checkpoint)


def _train(cfg: DictConfig, checkpoint: dict | None) -> dict:
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    env = engine.make_train_env(cfg, checkpoint["obs_norm"] if checkpoint is not None else None)
    _check_action_space(cfg, env)
    run_dir = make_run_dir(cfg, f"offpolicy-{cfg.algo}-{_env_tag(cfg.env.name)}")
    parts = build_parts(cfg, env)
    collector, replay, trainer = _build_engine(cfg, env, parts, run_dir)
    if checkpoint is not None:
        _restore(cfg, checkpoint, trainer, parts, run_dir)
    counters = checkpoint["counters"] if checkpoint is not None else {}
    steps = engine.optim_steps_per_batch(cfg)
    where = (f"Ray: {cfg.ray.num_collectors} collector actors x {cfg.env.num_envs} envs, {cfg.ray.world_size} "
             f"{cfg.ray.backend} learner ranks x {cfg.optim.batch_size // cfg.ray.world_size} samples; "
             if cfg.engine == "ray" else "")
    print(f"offpolicy {cfg.algo} on {cfg.env.name}: {where}UTD {cfg.optim.utd_ratio:g} optimiser steps per collected "
          f"transition = {steps} steps per {cfg.collector.frames_per_batch}-frame batch, batch size "
          f"{cfg.optim.batch_size} ({cfg.optim.batch_size * cfg.optim.utd_ratio:g} replayed samples per transition); "
          f"prefill {cfg.collector.prefill_frames} frames; run dir {run_dir}"
          + (f"; resumed at {counters['collected_frames']} frames" if counters else ""), flush=True)

    logger = SharedLogger(make_logger(cfg.logger.backend, run_dir, config=OmegaConf.to_container(cfg, resolve=True)))
    refresh_policy = None
    if cfg.engine == "ray":
        monitor = ray_engine.RayMonitor(cfg, trainer, logger, steps_per_batch=steps,
                                        exploration_value=parts.exploration_value, action_spec=env.action_spec_unbatched,
                                        discrete=parts.discrete, start=counters)
        mirror = ray_engine.LearnerMirror(trainer, parts.eval_policy)
        if checkpoint is not None:
            trainer.register_op("setup", ray_engine.RestoreLearner(trainer, checkpoint["learner"]))
        trainer.register_op("setup", monitor.setup)
        trainer.register_op("post_steps", monitor)
        trainer.register_op("shutdown", mirror.refresh)  # the last moment the learner ranks are up
        progress, learner_state, refresh_policy = monitor.progress, mirror.state_dict, mirror.refresh_policy
    else:
        trainer.register_op("batch_process", PrefillGate(trainer, cfg.collector.prefill_frames, steps))
        invariants = Invariants(trainer, sample_shape=engine.sample_shape(cfg), steps_per_batch=steps,
                                prefill_frames=cfg.collector.prefill_frames, check_every=cfg.invariants.check_every,
                                version_offset=counters.get("batches", 0))
        invariants.register(trainer)
        metrics = Metrics(trainer, logger, interval_s=cfg.logger.interval_s, action_spec=env.action_spec_unbatched,
                          discrete=parts.discrete, exploration_value=parts.exploration_value,
                          start_episodes=counters.get("episodes", 0), start_elapsed_s=counters.get("elapsed_s", 0.0))
        metrics.register(trainer)

        def progress() -> dict:
            return {"batches": invariants.batches, "episodes": metrics.episodes, "elapsed_s": metrics.elapsed_s,
                    "last_return": metrics.last_return, "policy_version": collector.policy_version}

        def learner_state() -> dict:
            return local_learner_state(trainer, parts)
    if parts.exploration is not None and not parts.discrete:
        trainer.register_op("post_steps", AnnealExploration(trainer, parts.exploration))
    video_dir = run_dir / "videos" if cfg.eval.video else None
    norm = engine.obs_norm_state(env)
    evaluator = AsyncEvaluator(lambda render: engine.make_eval_env(cfg, render=render, obs_norm=norm),
                               parts.eval_policy, logger,
                               episodes=cfg.eval.episodes, max_steps=cfg.eval.max_episode_steps, video_dir=video_dir)
    if cfg.eval.interval_frames:
        trainer.register_op("post_steps", PeriodicEval(trainer, evaluator, parts.eval_policy,
                                                       cfg.eval.interval_frames, refresh=refresh_policy))
    checkpointer = Checkpointer(cfg, run_dir, trainer, parts, progress, learner_state, obs_norm=norm)
    trainer.register_op("post_steps", checkpointer.maybe_save)

    status, error = "completed", None
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}

    def stop(signum, frame):
        nonlocal status
        status = "interrupted"
        trainer.request_stop(signal.Signals(signum).name)
        print(f"\n{signal.Signals(signum).name}: stopping after this batch (again to stop now)", file=sys.stderr)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

    for sig in previous:
        signal.signal(sig, stop)
    try:
        if trainer.collected_frames < cfg.total_frames:  # torchrl's loop always collects one batch first
            trainer.train()
    except InvariantError as exc:  # also when raised in a Ray learner rank (Ray's error derives from the cause)
        status, error = "invariant_broken", str(exc).strip().splitlines()[-1]
    except KeyboardInterrupt:
        status = "interrupted"
    except Exception as exc:
        error = ray_engine.describe_failure(exc) if cfg.engine == "ray" else None
        if error is None:
            raise
        status = "failed"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        collector.shutdown()
        try:
            path = checkpointer.save()
        except ray_engine.LearnerLost as exc:
            path = checkpointer.path if checkpointer.path.exists() else None
            print(f"warning: {exc}: the latest checkpoint is {path}", file=sys.stderr)

    frames = trainer.collected_frames

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    for sig in previous:  # Ctrl-C / SIGTERM during the final evaluation: stop it, still write the summary
        signal.signal(sig, interrupt)
    try:
        if status == "completed" and cfg.eval.final_episodes:
            print(f"final evaluation: {cfg.eval.final_episodes} episodes", flush=True)
            evaluator.submit(frames, parts.eval_policy, episodes=cfg.eval.final_episodes)
        evaluator.wait()
    except KeyboardInterrupt:
        status = "interrupted"
        print("\ninterrupted during the final evaluation (training was complete)", file=sys.stderr)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        evaluator.close()
        logger.close()
    evals = [stats["return"] for _, stats in evaluator.results]
    done = progress()
    summary = {
        "algo": cfg.algo, "env": cfg.env.name, "engine": cfg.engine, "status": status, "error": error,
        "frames": frames, "optim_steps": trainer._optim_count, "batches": done["batches"],
        "policy_version": done["policy_version"], "replay_writes": replay.write_count,
        "episodes": done["episodes"], "utd_ratio": cfg.optim.utd_ratio,
        "train_return_last": done["last_return"],
        "eval_return_last": evals[-1] if evals else None, "eval_return_best": max(evals) if evals else None,
        "elapsed_s": round(done["elapsed_s"], 2), "checkpoint": path and str(path), "run_dir": str(run_dir),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    plot_curves(run_dir, {"train": "train/return", "eval": "eval/return"},
                title=f"{cfg.algo.upper()} on {cfg.env.name}", xlabel="collected frames")
    return summary


def main(argv: list[str]) -> int:
    """CLI: compose the config, train, print where the results are; exit 3 on a broken invariant, 4 when a Ray actor
    fails, 130 on Ctrl-C."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(help_text(CONFIG_DIR, USAGE, ALIASES, GROUPS))
        return 0
    cfg, checkpoint = compose_config(argv)
    summary = train(cfg, checkpoint)
    print(json.dumps(summary))
    if summary["status"] == "invariant_broken":
        print(f"error: invariant broken: {summary['error']}; checkpoint saved to {summary['checkpoint']}",
              file=sys.stderr)
        return EXIT_INVARIANT
    if summary["status"] == "failed":
        print(f"error: {summary['error']}; latest checkpoint: {summary['checkpoint']}", file=sys.stderr)
        return EXIT_FAILED
    if summary["status"] == "interrupted":
        print(f"interrupted; checkpoint saved to {summary['checkpoint']}", file=sys.stderr)
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    run_cli(main)
