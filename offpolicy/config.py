"""The off-policy engine's config: defaults (configs/offpolicy/), groups (algo, profile), the rules each key obeys and
the checks across keys. A broken rule is one ConfigError (the entry points print it as one ``error:`` line, exit 2).
"""
from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from offpolicy.algos import ALGOS, algorithm
from offpolicy.algos.networks import ACTIVATIONS
from offpolicy.checkpoint import RENAMED, Checkpoint
from offpolicy.engines import ENGINES, engine_class
from shared.config import CONFIG_ROOT, ConfigError, Group, Rule, compose, parse_overrides
from shared.env_backends import ENV_BACKENDS, check_backend
from shared.envs import check_gym_name, check_renders, env_kind, warn_unless_found_by_name
from shared.logging import BACKENDS, check_logger_backend

CONFIG_DIR = CONFIG_ROOT / "offpolicy"
ALIASES = {"env": "env.name", "lr": "optim.lr", "utd": "optim.utd_ratio"}
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
    "threads": Rule(min=1, integer=True, auto=True),
    "collector.env_steps_per_batch": Rule(min=1, integer=True),
    "collector.prefill_env_steps": Rule(min=0, integer=True),
    "collector.overlap_timeout_s": Rule(min=1),
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
    "eval.stop_return": Rule(number=True, nullable=True),
    "logger.backend": Rule(choices=BACKENDS),
    "logger.interval_s": Rule(min=0),
    "checkpoint.interval_s": Rule(min=0),
    "invariants.check_every": Rule(min=1, integer=True),
    "compile.enabled": Rule(choices=("auto", True, False)),
    "compile.auto_min_optim_steps": Rule(min=0, integer=True),
    "compile.mode": Rule(choices=COMPILE_MODES, nullable=True),
    "optim.replay_ratio": Rule(min=1e-12, nullable=True),
    "engine": Rule(choices=tuple(ENGINES)),
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

def compose_config(argv: list[str]) -> tuple[DictConfig, Checkpoint | None]:
    """Compose and validate the config; with ``resume=PATH`` the checkpoint's config is the base. Returns
    ``(cfg, checkpoint or None)``."""
    overrides = parse_overrides(argv, {**ALIASES, **RENAMED})
    if "env.kind" in overrides:
        raise ConfigError(f"env.kind={overrides['env.kind']!r} is not allowed; allowed: set env.name (env.kind is read "
                          "off it: atari, dmc or gymnasium)")
    resume = overrides.get("resume")
    checkpoint = Checkpoint.read(resume) if resume not in (None, "", "null") else None
    base = checkpoint.config if checkpoint is not None else None
    if base is not None and overrides.get("algo", base["algo"]) != base["algo"]:
        raise ConfigError(f"algo={overrides['algo']!r} differs from the resumed run's; allowed: {base['algo']}")
    cfg = compose(CONFIG_DIR, overrides, groups=GROUPS, rules=RULES, base=base)
    if not isinstance(cfg.env.name, str) or not cfg.env.name.strip():
        raise ConfigError(f"env.name={cfg.env.name!r} is not allowed; allowed: a Gymnasium id, module:EnvId, an ALE "
                          "game or dmc:<domain>-<task> (leave env out for the algorithm's default)")
    cfg.env.kind = env_kind(cfg.env.name)  # decided here once; every part of the run reads env.kind
    check_logger_backend(cfg.logger.backend)
    if checkpoint is not None:
        checkpoint.check_resumable(cfg)
    if cfg.algo not in ALGOS:
        raise ConfigError(f"algo={cfg.algo!r} is not allowed; allowed: {', '.join(ALGOS)}")
    for key, rule in algorithm(cfg.algo).rules.items():
        rule.validate(key, OmegaConf.select(cfg, key))
    if algorithm(cfg.algo).check is not None:
        algorithm(cfg.algo).check(cfg)
    atari = cfg.env.kind == "atari"
    if atari:
        if not algorithm(cfg.algo).discrete:
            raise ConfigError(f"env.name={cfg.env.name!r} is an ALE game; allowed for {cfg.algo}: a continuous-action "
                              "Gymnasium id (HalfCheetah-v5, Pendulum-v1, Hopper-v5, Humanoid-v5)")
    else:
        check_gym_name(cfg.env.name)
        if cfg.env.kind == "gymnasium" and ":" not in cfg.env.name:
            warn_unless_found_by_name(cfg.env.name)
        if cfg.eval.video and cfg.env.kind != "dmc":
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
    if (cfg.env.from_pixels or atari) and cfg.env.obs_norm:
        raise ConfigError(f"env.obs_norm=true is not allowed with {'an ALE game' if atari else 'env.from_pixels=true'}"
                          "; allowed: obs_norm for state observations (images are scaled by 1/255 in the encoder)")
    if cfg.collector.prefill_env_steps > cfg.replay.size:
        raise ConfigError(f"collector.prefill_env_steps={cfg.collector.prefill_env_steps} is not allowed; allowed: <= "
                          f"replay.size={cfg.replay.size}")
    ratio = cfg.optim.batch_size * cfg.optim.utd_ratio
    if cfg.optim.replay_ratio is not None and abs(ratio - cfg.optim.replay_ratio) > 1e-6 * ratio:
        raise ConfigError(f"optim.replay_ratio={cfg.optim.replay_ratio} is not allowed; allowed: optim.batch_size * "
                          f"optim.utd_ratio = {ratio:g} (or null)")
    if cfg.compile.cudagraphs and not (cfg.compile.enabled is True and cfg.engine == "ray" and cfg.ray.backend == "nccl"
                                       and cfg.ray.world_size == 1):
        raise ConfigError("compile.cudagraphs=true is not allowed here; allowed: with compile.enabled=true on a CUDA "
                          "learner (engine=ray ray.backend=nccl ray.world_size=1)")
    engine_class(cfg.engine).check_config(cfg)
    return cfg, checkpoint


def _check_frames_once(cfg: DictConfig) -> None:
    """``replay.frames_once`` rebuilds ALE frame stacks from one in-memory stream per env, sampled uniformly."""
    unsupported = {"env.name": None if cfg.env.kind == "atari" else cfg.env.name,
                   "engine": "ray" if cfg.engine == "ray" else None,
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


def check_env_backend(cfg: DictConfig) -> None:
    """``env.backend`` can step this run's env here (checked before anything is built or written); a ConfigError
    otherwise."""
    backend = cfg.env.backend
    if backend == "gymnasium":
        return
    if cfg.env.kind != "gymnasium" or cfg.env.from_pixels:
        raise ConfigError(f"env.backend={backend} is not allowed for env.name={cfg.env.name!r}"
                          f"{' with env.from_pixels=true' if cfg.env.from_pixels else ''}; allowed: gymnasium (ALE "
                          "games, dm_control and pixels go through the shared Gymnasium/Atari stack)")
    check_backend(backend, cfg.env.name)
