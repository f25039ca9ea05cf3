"""The off-policy engine's config: defaults (configs/offpolicy/), groups (algo, profile), the rules each key obeys and
the checks across keys. A broken rule is one ConfigError (the entry points print it as one ``error:`` line, exit 2).
"""
from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from offpolicy.algos import ALGOS, RENAMED_KEYS, algorithm
from offpolicy.algos.networks import ACTIVATIONS
from offpolicy.envs import is_atari
from offpolicy.replay import replay_scratch_dir
from shared.checkpoint import load_checkpoint, resumed_config
from shared.config import CONFIG_ROOT, ConfigError, Group, Rule, check_kept_on_resume, compose, parse_overrides
from shared.envs import check_gym_name, check_renders
from shared.backends import ENV_BACKENDS, check_backend
from shared.logging import BACKENDS, check_logger_backend

CONFIG_DIR = CONFIG_ROOT / "offpolicy"
CHECKPOINT_KEYS = ("config", "counters", "learner")  # what offpolicy.train writes (train.Run.save_checkpoint)
ALIASES = {"env": "env.name", "lr": "optim.lr", "utd": "optim.utd_ratio"}
# "frames" means emulator frames in both engines; off-policy counts env steps (transitions), named so since 0.2. The
# old off-policy names stay accepted, on the command line and in the config of a resumed older checkpoint.
RENAMED = {"total_frames": "total_env_steps", "collector.frames_per_batch": "collector.env_steps_per_batch",
           "collector.prefill_frames": "collector.prefill_env_steps", "eval.interval_frames": "eval.interval_env_steps",
           **RENAMED_KEYS}
GROUPS = (Group("algo", may_add_keys=True), Group("profile"))
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def _positive_ints(key):
    def check(value):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            raise ConfigError(f"{key}={value!r} is not allowed; allowed: a non-empty list of positive integers")
    return check


RULES = {
    "env.num_envs": Rule(min=1, integer=True),
    "total_env_steps": Rule(min=1, integer=True),
    "seed": Rule(min=0, integer=True),
    "threads": Rule(min=1, integer=True),
    "collector.env_steps_per_batch": Rule(min=1, integer=True),
    "collector.prefill_env_steps": Rule(min=0, integer=True),
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
    "loss.n_steps": Rule(min=1, max=255, integer=True),  # FrameReplay keeps the window length in a uint8
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
    "env.backend": Rule(choices=ENV_BACKENDS),
    "env.image_size": Rule(min=36, integer=True),
    "env.obs_norm_init_steps": Rule(min=2, integer=True),
    "eval.interval_env_steps": Rule(min=0, integer=True),
    "eval.episodes": Rule(min=1, integer=True),
    "eval.final_episodes": Rule(min=0, integer=True),
    "eval.max_episode_steps": Rule(min=1, integer=True),
    "logger.backend": Rule(choices=BACKENDS),
    "logger.interval_s": Rule(min=0),
    "checkpoint.interval_s": Rule(min=0),
    "invariants.check_every": Rule(min=1, integer=True),
    "compile.mode": Rule(choices=COMPILE_MODES, nullable=True),
    "optim.replay_ratio": Rule(min=1e-12, nullable=True),
    "engine": Rule(choices=("local", "ray")),
    "ray.num_cpus": Rule(min=1, integer=True, nullable=True),
    "ray.num_gpus": Rule(min=0, integer=True, nullable=True),
    "ray.num_collectors": Rule(min=1, integer=True),
    "ray.max_collector_restarts": Rule(min=0, integer=True),
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

def compose_config(argv: list[str]) -> tuple[DictConfig, dict | None]:
    """Compose and validate the config; with ``resume=PATH`` the checkpoint's config is the base. Returns
    ``(cfg, checkpoint or None)``."""
    overrides = parse_overrides(argv, {**ALIASES, **RENAMED})
    resume = overrides.get("resume")
    checkpoint = (load_checkpoint(resume, key="resume", required=CHECKPOINT_KEYS, written_by="offpolicy.train")
                  if resume not in (None, "", "null") else None)
    base = resumed_config(_renamed_keys(checkpoint["config"]), resume) if checkpoint is not None else None
    if base is not None and overrides.get("algo", base["algo"]) != base["algo"]:
        raise ConfigError(f"algo={overrides['algo']!r} differs from the resumed run's; allowed: {base['algo']}")
    cfg = compose(CONFIG_DIR, overrides, groups=GROUPS, rules=RULES, base=base)
    check_logger_backend(cfg.logger.backend)
    if checkpoint is not None:
        _check_resumable(cfg, checkpoint)
    if cfg.algo not in ALGOS:
        raise ConfigError(f"algo={cfg.algo!r} is not allowed; allowed: {', '.join(ALGOS)}")
    for key, rule in algorithm(cfg.algo).rules.items():
        rule.validate(key, OmegaConf.select(cfg, key))
    if is_atari(cfg):
        if not algorithm(cfg.algo).discrete:
            raise ConfigError(f"env.name={cfg.env.name!r} is an ALE game; allowed for {cfg.algo}: a continuous-action "
                              "Gymnasium id (HalfCheetah-v5, Pendulum-v1, Hopper-v5, Humanoid-v5)")
    else:
        check_gym_name(cfg.env.name)
        if cfg.eval.video and not cfg.env.name.startswith("dmc:"):
            check_renders(cfg.env.name)
    check_env_backend(cfg)
    steps = cfg.optim.utd_ratio * cfg.collector.env_steps_per_batch
    if abs(steps - round(steps)) > 1e-6 or round(steps) < 1:
        raise ConfigError(f"optim.utd_ratio={cfg.optim.utd_ratio} gives {steps:g} optimiser steps per batch of "
                          f"collector.env_steps_per_batch={cfg.collector.env_steps_per_batch}; allowed: a utd_ratio "
                          "that makes it a positive integer")
    if cfg.collector.env_steps_per_batch % cfg.env.num_envs:
        raise ConfigError(f"collector.env_steps_per_batch={cfg.collector.env_steps_per_batch} is not allowed; "
                          f"allowed: a multiple of env.num_envs={cfg.env.num_envs}")
    if not cfg.optim.batch_size <= max(cfg.collector.prefill_env_steps, cfg.collector.env_steps_per_batch):
        raise ConfigError(f"optim.batch_size={cfg.optim.batch_size} is not allowed; allowed: <= "
                          "max(collector.prefill_env_steps, collector.env_steps_per_batch), so the first sample can be "
                          "drawn")
    if cfg.replay.slice_len and cfg.optim.batch_size % cfg.replay.slice_len:
        raise ConfigError(f"replay.slice_len={cfg.replay.slice_len} is not allowed; allowed: a divisor of "
                          f"optim.batch_size={cfg.optim.batch_size} (each step replays batch_size transitions)")
    if cfg.loss.value_estimator != "td0" and not cfg.replay.slice_len:
        raise ConfigError(f"loss.value_estimator={cfg.loss.value_estimator} is not allowed without "
                          "replay.slice_len; allowed: td0, or set replay.slice_len so targets run along trajectories")
    steps_per_env = cfg.collector.env_steps_per_batch // cfg.env.num_envs // (
        cfg.ray.num_collectors if cfg.engine == "ray" else 1)
    if cfg.loss.n_steps > max(steps_per_env, 1):
        raise ConfigError(f"loss.n_steps={cfg.loss.n_steps} is not allowed; allowed: <= the {steps_per_env} steps each "
                          "env takes per collected batch (collector.env_steps_per_batch / env.num_envs / collectors): "
                          "windows stop at the batch's end")
    if cfg.loss.n_steps > 1 and (cfg.loss.value_estimator != "td0" or cfg.replay.slice_len):
        raise ConfigError(f"loss.n_steps={cfg.loss.n_steps} is not allowed with loss.value_estimator="
                          f"{cfg.loss.value_estimator} and replay.slice_len={cfg.replay.slice_len}; allowed: n_steps > 1 "
                          "with td0 and no slice_len (td1 / tdlambda already look further ahead)")
    if cfg.replay.frames_once:
        _check_frames_once(cfg)
    if (cfg.env.from_pixels or is_atari(cfg)) and cfg.env.obs_norm:
        raise ConfigError(f"env.obs_norm=true is not allowed with {'an ALE game' if is_atari(cfg) else 'env.from_pixels=true'}"
                          "; allowed: obs_norm for state observations (images are scaled by 1/255 in the encoder)")
    if cfg.collector.prefill_env_steps > cfg.replay.size:
        raise ConfigError(f"collector.prefill_env_steps={cfg.collector.prefill_env_steps} is not allowed; allowed: <= "
                          f"replay.size={cfg.replay.size}")
    ratio = cfg.optim.batch_size * cfg.optim.utd_ratio
    if cfg.optim.replay_ratio is not None and abs(ratio - cfg.optim.replay_ratio) > 1e-6 * ratio:
        raise ConfigError(f"optim.replay_ratio={cfg.optim.replay_ratio} is not allowed; allowed: optim.batch_size * "
                          f"optim.utd_ratio = {ratio:g} (or null)")
    if cfg.compile.cudagraphs and not (cfg.compile.enabled and cfg.engine == "ray" and cfg.ray.backend == "nccl"
                                       and cfg.ray.world_size == 1):
        raise ConfigError("compile.cudagraphs=true is not allowed here; allowed: with compile.enabled=true on a CUDA "
                          "learner (engine=ray ray.backend=nccl ray.world_size=1)")
    if cfg.engine == "ray":
        _check_ray(cfg)
    return cfg, checkpoint


def _check_frames_once(cfg: DictConfig) -> None:
    """``replay.frames_once`` rebuilds ALE frame stacks from one in-memory stream per env, sampled uniformly."""
    unsupported = {"env.name": None if is_atari(cfg) else cfg.env.name, "engine": "ray" if cfg.engine == "ray" else None,
                   "replay.storage": "memmap" if cfg.replay.storage == "memmap" else None,
                   "replay.prioritized": True if cfg.replay.prioritized else None,
                   "replay.slice_len": cfg.replay.slice_len,
                   "replay.size": (cfg.replay.size if cfg.replay.size < 2 * cfg.collector.env_steps_per_batch
                                   else None)}
    for key, value in unsupported.items():
        if value is not None:
            raise ConfigError(f"{key}={value!r} is not allowed with replay.frames_once=true; allowed: an ALE game, "
                              "engine=local, replay.storage=memory, uniform replay (no prioritized, no slice_len), "
                              "replay.size >= 2 x collector.env_steps_per_batch")


# what the checkpoint's networks and optimisers were built for: a resume cannot change them
# (env.obs_norm: the networks learned on raw or on standardised inputs; loss.value_estimator: the loss's state keys)
SHAPE_KEYS = ("model.hidden", "model.activation", "env.name", "env.from_pixels", "env.image_size",
              "env.atari.frame_stack", "env.atari.image_size", "env.obs_norm",
              "loss.value_estimator")  # and the algorithm's own (Algorithm.shape_keys)
# what a saved replay was written with: a resume that restores it cannot change them (the sampler's layout too)
REPLAY_KEYS = ("loss.n_steps", "replay.frames_once", "replay.prioritized", "replay.slice_len")


def _check_resumable(cfg: DictConfig, checkpoint: dict) -> None:
    """A resume keeps the networks' shapes, and a memmap replay finds its files (or the run resumes without it:
    ``replay.storage=memory``, refilled by the prefill)."""
    saved = OmegaConf.create(_renamed_keys(checkpoint["config"]))
    check_kept_on_resume(cfg, saved, SHAPE_KEYS + algorithm(cfg.algo).shape_keys,
                         "the checkpoint's networks and loss were built for it")
    if checkpoint.get("replay") is not None:  # stored transitions are n-step ones, frames in their own layout
        keys = [*REPLAY_KEYS, *(("loss.gamma",) if cfg.loss.n_steps > 1 else ()),
                *(("replay.size", "env.num_envs") if cfg.replay.frames_once else ())]
        check_kept_on_resume(cfg, saved, keys, "its saved replay was written with it")
    if checkpoint.get("replay") is not None and saved.replay.storage == cfg.replay.storage == "memmap":
        scratch = replay_scratch_dir(cfg, Path(cfg.run_dir))
        if not (scratch / "meta.json").exists():
            raise ConfigError(f"replay.scratch_dir={str(scratch)!r}: the resumed run's replay files are gone; allowed: "
                              "that directory with its files, or replay.storage=memory (resume with an empty replay, "
                              "refilled by the prefill)")


def check_env_backend(cfg: DictConfig) -> None:
    """``env.backend`` can step this run's env here (checked before anything is built or written); a ConfigError
    otherwise."""
    backend = cfg.env.backend
    if backend == "gymnasium":
        return
    if is_atari(cfg) or cfg.env.from_pixels or cfg.env.name.startswith("dmc:"):
        raise ConfigError(f"env.backend={backend} is not allowed for env.name={cfg.env.name!r}"
                          f"{' with env.from_pixels=true' if cfg.env.from_pixels else ''}; allowed: gymnasium (ALE "
                          "games, dm_control and pixels go through the shared Gymnasium/Atari stack)")
    check_backend(backend, cfg.env.name)


# keys newer than some checkpoints, with what those runs used: a resume keeps them (a profile file's value today
# would change the resumed run's recipe)
ADDED_KEYS = {"loss.n_steps": 1, "replay.frames_once": False}  # (an algorithm's own: Algorithm.added_keys)


def _renamed_keys(config: dict) -> dict:
    """``config`` (a checkpoint's) with the keys of :data:`RENAMED` under their current names and the keys added
    since it was written (:data:`ADDED_KEYS`) at the values it ran with."""
    config = OmegaConf.create(config)
    for old, new in RENAMED.items():
        if OmegaConf.select(config, old) is not None:
            OmegaConf.update(config, new, OmegaConf.select(config, old))
            parent, _, leaf = old.rpartition(".")
            del (OmegaConf.select(config, parent) if parent else config)[leaf]
    own = algorithm(config["algo"]).added_keys if config.get("algo") in ALGOS else {}
    added = {**ADDED_KEYS, **own}
    for key, value in added.items():
        if OmegaConf.select(config, key) is None:
            OmegaConf.update(config, key, value)
    return OmegaConf.to_container(config)


def _check_ray(cfg: DictConfig) -> None:
    """What the Ray engine needs on top of the local checks."""
    ray_cfg = cfg.ray
    if cfg.optim.batch_size % ray_cfg.world_size:
        raise ConfigError(f"optim.batch_size={cfg.optim.batch_size} is not allowed; allowed: a multiple of "
                          f"ray.world_size={ray_cfg.world_size} (the global batch is split evenly over the ranks)")
    per_round = ray_cfg.num_collectors * cfg.env.num_envs
    if cfg.collector.env_steps_per_batch % per_round:
        raise ConfigError(f"collector.env_steps_per_batch={cfg.collector.env_steps_per_batch} is not allowed; "
                          f"allowed: a multiple of ray.num_collectors * env.num_envs = {per_round}")
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


def check_spaces(cfg: DictConfig, env) -> None:
    """The algorithm fits the env's actions: discrete (DQN) or bounded continuous (the others). (Observations were
    checked with the name: shared/envs.py check_gym_name.)"""
    from torchrl.data import Bounded, OneHot

    spec = env.action_spec_unbatched
    discrete = algorithm(cfg.algo).discrete
    if discrete and not isinstance(spec, OneHot):
        raise ConfigError(f"env.name={cfg.env.name!r} has continuous actions; allowed for {cfg.algo}: a "
                          "discrete-action env (CartPole-v1, an ALE game such as Pong)")
    if not discrete and not isinstance(spec, Bounded):
        raise ConfigError(f"env.name={cfg.env.name!r} has no bounded continuous actions; allowed for {cfg.algo}: "
                          "HalfCheetah-v5, Pendulum-v1, Hopper-v5, Humanoid-v5 or another Box-action env")
