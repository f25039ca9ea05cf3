"""The A3C config, declared once: every key's default, what it allows and its doc (one dataclass per section,
shared/schema.py), the checks across keys, profiles in configs/a3c/profile/. The commented YAML reference
(configs/a3c/config.yaml) and the A3C tables of docs/config.md are generated from it: ``python -m a3c.config``."""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from shared import schema
from shared.atari import check_atari_name
from shared.config import CONFIG_ROOT, ConfigError, Group, check_kept_on_resume, compose, help_text, parse_overrides
from shared.logging import BACKENDS, check_logger_backend
from shared.models import AtariActorCritic, AtariTrunk
from shared.schema import key, section

CONFIG_DIR = CONFIG_ROOT / "a3c"
ALIASES = {"env": "env.name", "lr": "optim.lr", "arch": "model.arch"}
GROUPS = (Group("profile"),)
USAGE = "usage: python -m a3c.train [env=Pong] [workers=N] [profile=smoke] [key=value ...]"
HEADER = """A3C on Atari: every default, with what each key does. Override any key on the command line:
  python -m a3c.train env=Breakout workers=4 a3c.t_max=5
Short aliases: env= -> env.name=, lr= -> optim.lr=, arch= -> model.arch=.
Generated from a3c/config.py by `python -m a3c.config`: edit the declarations there, not this file."""


def check_env_name(name) -> None:
    """A3C's env is an ALE game: its workers step ale_py's AtariVectorEnv directly (shared/atari.py), with no
    Gymnasium env in between, so an own env (``module:EnvId``) or a dm_control task is one clear ConfigError."""
    if ":" in str(name):
        raise ConfigError(f"env.name={name!r} is not allowed: A3C takes ALE games only (its workers step ale_py's "
                          "AtariVectorEnv); allowed: a short name such as Pong or a full id such as ALE/Pong-v5 (envs "
                          "of your own package, module:EnvId, and dm_control tasks run in the off-policy engine)")
    check_atari_name(name)


@dataclass
class EnvConfig:
    name: str = key('Pong', "any ALE game by short name (`Pong`, `Breakout`, `SpaceInvaders`), ROM id "
                            "(`space_invaders`) or full id (`ALE/Pong-v5`, `PongNoFrameskip-v4`); ALE games only (an "
                            "own env `module:EnvId` is refused)", check=check_env_name)
    envs_per_worker: int = key(8, "games stepped together by each worker (batched inference; see "
                                  "benchmarks/a3c_throughput.py)", min=1, integer=True)
    frame_skip: int = key(4, 'emulator frames per agent step (max-pooled over the last two)', min=1, integer=True)
    frame_stack: int = key(4, 'observations stacked along channels', min=1, integer=True)
    image_size: int = key(84, 'frames resized to image_size x image_size', min=36, max=256, integer=True)
    grayscale: bool = key(True, 'false keeps RGB (3 channels per stacked frame)')
    noop_max: int = key(30, 'up to this many no-ops after reset', min=0, integer=True)
    fire_reset: bool = key(True, 'press FIRE after reset in games that need it')
    episodic_life: bool = key(True, 'a lost life ends the episode for the value bootstrap only; scores stay whole-game')
    clip_rewards: bool = key(True, 'train on sign(reward); logged returns stay unclipped')
    sticky_actions: float = key(0.0, "repeat-action probability (0.25 is the v5 default; 0 matches "
                                     "`PongDeterministic-v4`)", min=0.0, max=1.0)
    max_episode_frames: int = key(108000, "truncate an episode after this many emulator frames (counted as done)",
                                          min=1, integer=True)


@dataclass
class ModelConfig:
    arch: str = key('small', "`small` (16-32 convs, 256 units, the A3C paper's) or `nature` (32-64-64 convs, 512 "
                             "units)", choices=AtariTrunk.ARCHS)
    recurrent: str | None = key(None, "null (feed-forward) | lstm: an LSTM between the trunk and the heads (the A3C "
                                      "paper's recurrent agent), its state carried per game across rollouts, reset at "
                                      "a game or life end, trained by backprop through each rollout (a3c.t_max "
                                      "steps); needs a3c.minibatches=1", choices=(None, *AtariActorCritic.RECURRENT))
    lstm_size: int = key(256, "the LSTM's units (model.recurrent=lstm)", min=1, max=4096, integer=True)


@dataclass
class AlgorithmConfig:
    t_max: int = key(10, "agent steps per env per rollout: each update sees envs_per_worker x t_max = 80 steps",
                         min=1, integer=True)
    gamma: float = key(0.99, 'discount', min=0.0, max=1.0)
    gae_lambda: float = key(1.0, "GAE lambda; 1.0 gives the A3C paper's n-step returns", min=0.0, max=1.0)
    entropy_coeff: float = key(0.01, 'entropy bonus weight', min=0)
    critic_coeff: float = key(0.5, 'value loss weight', min=0)
    loss_critic_type: str = key('l2', '`l2` or `smooth_l1`', choices=('l2', 'smooth_l1'))
    max_grad_norm: float = key(0.5, "clip the global gradient norm before each optimizer step (losses are means, not "
                                    "sums)", min=1e-08)
    minibatches: int = key(1, "> 1 shuffles each rollout through a torchrl replay buffer into this many minibatches, "
                              "one optimizer step each", min=1, integer=True)


@dataclass
class OptimConfig:
    name: str = key('rmsprop', "rmsprop (SharedRMSprop, the A3C paper's) | adam (SharedAdam); state in shared memory",
                               choices=('adam', 'rmsprop'))
    lr: float = key(0.0007, 'learning rate', min=1e-12, max=1.0)
    eps: float = key(1e-05, 'epsilon of Adam / RMSprop', min=0.0)
    rmsprop_alpha: float = key(0.99, 'RMSprop smoothing constant', min=0.0, max=1.0)
    rmsprop_initial_square_avg: float = key(0.0, "where RMSprop's running average of squared gradients starts: 0 as "
                                                 "in torch (the first steps are ~10x `lr`, sign-like), 1 as in "
                                                 "TensorFlow / OpenAI baselines (small first steps, a warm-up); the "
                                                 "LSTM agent needs 1 to learn Pong (see [results](results.md#a3c))",
                                                 min=0)
    weight_decay: float = key(0.0, 'L2 weight decay', min=0)


@dataclass
class EvalConfig:
    interval_frames: int = key(2000000, "run greedy episodes every this many frames in a separate process; the "
                                        "workers wait at an interval's end for the evaluation of its weights, so none "
                                        "lags more or is skipped (0 = never)", min=0, integer=True)
    episodes: int = key(3, 'greedy episodes per periodic evaluation', min=1, integer=True)
    final_episodes: int = key(10, 'greedy episodes in the final evaluation (0 = none)', min=0, integer=True)
    max_episode_frames: int = key(108000, "cap on an evaluation episode's emulator frames", min=1, integer=True)
    video: bool = key(False, 'also write an mp4 of the first episode of each evaluation (needs the video extra)')


@dataclass
class LoggerConfig:
    backend: str = key('csv', "`csv`, `tensorboard` or `wandb` (CSV is always written; `WANDB_MODE=offline` works)",
                              choices=BACKENDS)
    interval_s: float = key(5.0, "worker 0 logs throughput and losses at most this often (episode returns as they "
                                 "come)", min=0)


@dataclass
class CheckpointConfig:
    interval_s: int = key(600, 'periodic checkpoint every this many seconds (0 = only the final one)', min=0)


@dataclass
class SupervisionConfig:
    max_restarts: int = key(3, "a worker that dies is restarted up to this many times in total; then the run stops",
                               min=0, integer=True)
    stop_timeout_s: float = key(8.0, 'on stop, wait this long for the workers, then terminate them', min=0.5, max=60)


@dataclass
class A3CConfig:
    env: EnvConfig = section(EnvConfig)
    model: ModelConfig = section(ModelConfig)
    workers: int = key(2, 'worker processes (each one torch thread); >= 1', min=1, max=256, integer=True)
    total_frames: int = key(40000000, "stop after this many emulator frames (agent steps x frame_skip), summed over "
                                      "workers", min=1, integer=True)
    seed: int = key(0, "worker *w* seeds its games with `seed + 1000 w` (a restarted worker gets new games)",
                       min=0, integer=True)
    a3c: AlgorithmConfig = section(AlgorithmConfig)
    optim: OptimConfig = section(OptimConfig)
    eval: EvalConfig = section(EvalConfig)
    logger: LoggerConfig = section(LoggerConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    supervision: SupervisionConfig = section(SupervisionConfig)
    run_dir: str | None = key(None, 'where the run writes (default runs/a3c-<env>-<time>)')
    resume: str | None = key(None, "a checkpoint: continue its counters, weights and optimizer state (its config, "
                                   "plus your overrides)")
    profile: str | None = key(None, 'a file in configs/a3c/profile/ (smoke = the CI config)')
    @staticmethod
    def check(cfg: DictConfig) -> None:
        """An LSTM is unrolled over the whole rollout; minibatches split the rollout evenly."""
        if cfg.model.recurrent and cfg.a3c.minibatches != 1:
            raise ConfigError(f"a3c.minibatches={cfg.a3c.minibatches} is not allowed with model.recurrent="
                              f"{cfg.model.recurrent}; allowed: 1 (the LSTM is unrolled over the whole rollout)")
        rollout = cfg.env.envs_per_worker * cfg.a3c.t_max
        if rollout % cfg.a3c.minibatches:
            raise ConfigError(f"a3c.minibatches={cfg.a3c.minibatches} must divide the rollout size "
                              f"env.envs_per_worker x a3c.t_max = {rollout}")


# what the checkpoint's model (its input channels and actions) and optimiser state were built for
RESUME_KEYS = ("env.name", "env.frame_stack", "env.image_size", "env.grayscale", "model.arch", "model.recurrent",
               "model.lstm_size", "optim.name")


def load_config(argv: list[str], base: dict | None = None) -> DictConfig:
    """Compose the A3C config from the command line's ``key=value`` words (``base``: a resumed checkpoint's
    config)."""
    return compose_config(parse_overrides(argv, ALIASES), base)


def compose_config(overrides: dict[str, str], base: dict | None = None) -> DictConfig:
    """Compose the A3C config from overrides already parsed by :func:`~shared.config.parse_overrides` (``base``: a
    resumed checkpoint's config)."""
    cfg = compose(schema.defaults(A3CConfig), overrides, config_dir=CONFIG_DIR, groups=GROUPS,
                  rules=schema.rules(A3CConfig), base=base)
    check_logger_backend(cfg.logger.backend)
    if base is not None:
        check_kept_on_resume(cfg, OmegaConf.create(base), RESUME_KEYS,
                             "the checkpoint's model and optimiser state were built for it")
    for check in schema.checks(A3CConfig):
        check(cfg)
    return cfg


def config_help() -> str:
    return help_text(schema.to_yaml(A3CConfig, HEADER), USAGE, ALIASES, GROUPS, CONFIG_DIR)


def write_reference() -> list[str]:
    """Rewrite the files generated from the declarations: configs/a3c/*.yaml and the A3C tables of docs/config.md.
    Returns the paths written."""
    from a3c.evaluate import EVALUATE_HEADER, EvaluateConfig
    from shared.export import ExportConfig, export_header

    docs = CONFIG_ROOT.parent / "docs" / "config.md"
    files = {CONFIG_DIR / "config.yaml": schema.to_yaml(A3CConfig, HEADER),
             CONFIG_DIR / "evaluate.yaml": schema.to_yaml(EvaluateConfig, EVALUATE_HEADER),
             CONFIG_DIR / "export.yaml": schema.to_yaml(ExportConfig, export_header("a3c")),
             docs: schema.replace_block(docs.read_text(), "a3c", schema.to_markdown(A3CConfig))}
    return [str(path) for path, content in files.items() if schema.write_if_changed(path, content)]


if __name__ == "__main__":
    print("\n".join(write_reference()) or "up to date")
