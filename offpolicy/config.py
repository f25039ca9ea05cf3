"""The off-policy engine's config, declared once: every key's default, what it allows and its doc (one dataclass per
section, shared/schema.py), the checks across keys beside the section they constrain, and the composition of a run's
config (defaults, the algorithm's section and file, a profile, a resumed run's config, ``key=value`` overrides). A
broken rule is one ConfigError (the entry points print it as one ``error:`` line, exit 2). The commented YAML
reference (configs/offpolicy/config.yaml) and docs/config.md are generated from it: ``python -m offpolicy.config``.
"""
from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from offpolicy.algos import ALGORITHMS, ALGOS, DEFAULT_ALGO, algorithm
from offpolicy.algos.networks import ACTIVATIONS
from offpolicy.checkpoint import Checkpoint
from offpolicy.engines import ENGINES, engine_class
from shared import schema
from shared.config import CONFIG_ROOT, ConfigError, Group, compose, parse_overrides
from shared.env_backends import ENV_BACKENDS, check_backend
from shared.envs import check_gym_name, check_renders, env_kind, warn_unless_found_by_name
from shared.logging import BACKENDS, check_logger_backend
from shared.schema import key, section

CONFIG_DIR = CONFIG_ROOT / "offpolicy"
ALIASES = {"env": "env.name", "lr": "optim.lr", "utd": "optim.utd_ratio"}
GROUPS = (Group("algo"), Group("profile"))
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")  # torch.compile's


def _positive_ints(name):
    def check(value):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
            raise ConfigError(f"{name}={value!r} is not allowed; allowed: a non-empty list of positive integers")
    return check


@dataclass
class EnvAtariConfig:
    frame_skip: int = key(4, 'Atari only: emulator frames per agent step')
    frame_stack: int = key(4, 'Atari only: stacked grey frames')
    image_size: int = key(84, 'Atari only: frames resized to this square size')
    noop_max: int = key(30, 'Atari only: random no-ops after reset')
    episodic_life: bool = key(True, 'Atari training only: a lost life ends the episode (evaluation plays whole games)')
    clip_rewards: bool = key(True, "Atari training only: rewards clipped to their sign (so `train/return` is clipped, "
                                   "`eval/` is not)")
    sticky_actions: float = key(0.0, 'Atari only: repeat_action_probability')


@dataclass
class EnvConfig:
    name: str | None = key(None, "null = the algorithm's default (DQN CartPole-v1; SAC/TD3/DDPG HalfCheetah-v5); any "
                                 "Gymnasium id (Pendulum-v1, Hopper-v5, Humanoid-v5...), an env of your own package "
                                 "module:EnvId (my_envs.drift:Drift-v0: the module is imported first and registers "
                                 "the id), a dm_control task dmc:<domain>-<task> (dmc:cheetah-run; needs the dmc "
                                 "extra) or, for DQN, an ALE game (Pong)")
    kind: str | None = key(None, "not set by hand: `atari`, `dmc` or `gymnasium`, decided once when the config is "
                                 "composed (`shared.envs.env_kind`) and read from there by every part of the run; "
                                 "`config.yaml` and checkpoints carry it")
    num_envs: int = key(1, "envs stepped together by the collector; rollouts [num_envs, T] are flattened to "
                           "[num_envs*T] before they go into the replay buffer", min=1, integer=True)
    backend: str = key('gymnasium', "who steps the training envs: gymnasium (torchrl GymEnv copies, batched by "
                                    "env.vector) | envpool (one C++ thread pool steps all num_envs copies; Gymnasium "
                                    "MuJoCo and classic-control ids; needs the envpool extra). Evaluation always "
                                    "plays the Gymnasium env", choices=ENV_BACKENDS)
    vector: str = key('serial', "gymnasium backend, num_envs > 1: serial (torchrl SerialEnv, in this process) | "
                                "process (ParallelEnv, one process per env). ALE games are batched by AtariVectorEnv "
                                "either way", choices=('serial', 'process'))
    from_pixels: bool = key(False, "MuJoCo / dm_control: observe uint8 camera images [3, image_size, image_size] "
                                   "instead of the state (networks get a conv encoder; keep replay.size near 100k: "
                                   "~24 KB/transition)")
    image_size: int = key(64, 'rendered image side (from_pixels only)', min=36, integer=True)
    obs_norm: bool = key(False, "standardise observations (torchrl ObservationNorm); statistics are fixed at start, "
                                "saved in checkpoints and used by the evaluation env")
    obs_norm_init_steps: int = key(1000, "random-action steps the statistics are computed from, per copy of the "
                                         "torchrl training env (one copy with the lean collector and on the Ray "
                                         "driver)", min=2, integer=True)
    atari: EnvAtariConfig = section(EnvAtariConfig, "Atari preprocessing (ale_py AtariVectorEnv), used only when "
                                                    "env.name is an ALE game")

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """The env suits the algorithm and the backend; images are not standardised."""
        atari = cfg.env.kind == "atari"
        if atari:
            if not algorithm(cfg.algo).discrete:
                raise ConfigError(f"env.name={cfg.env.name!r} is an ALE game; allowed for {cfg.algo}: a "
                                  "continuous-action Gymnasium id (HalfCheetah-v5, Pendulum-v1, Hopper-v5, "
                                  "Humanoid-v5)")
        else:
            check_gym_name(cfg.env.name)
            if cfg.env.kind == "gymnasium" and ":" not in cfg.env.name:
                warn_unless_found_by_name(cfg.env.name)
            if cfg.eval.video and cfg.env.kind != "dmc":
                check_renders(cfg.env.name)
        check_env_backend(cfg)
        if (cfg.env.from_pixels or atari) and cfg.env.obs_norm:
            images = "an ALE game" if atari else "env.from_pixels=true"
            raise ConfigError(f"env.obs_norm=true is not allowed with {images}"
                              "; allowed: obs_norm for state observations (images are scaled by 1/255 in the encoder)")


@dataclass
class CollectorConfig:
    env_steps_per_batch: int = key(1000, "transitions per collected batch; weights are published to the collector "
                                         "after each", min=1, integer=True)
    prefill_env_steps: int = key(5000, "transitions from the (stochastic) collection policy written before the first "
                                       "optimiser step (uniformly random actions where the algorithm's random_prefill is "
                                       "on)",
                                 min=0, integer=True)
    lean: bool = key(True, "`engine=local` with a Gymnasium state-vector env stepped in this process: collect without "
                           "torchrl's `Collector` (`offpolicy/collect/lean.py`: the Gymnasium copies stepped in a "
                           "loop with numpy, the policy on plain tensors where it can, one TensorDict per batch, the "
                           "same keys); false: torchrl's `Collector` everywhere (ALE games, dm_control, pixels, "
                           "envpool and `env.vector=process` always use it)")
    overlap: bool = key(False, "`engine=local` with the lean collector or an ALE game (torchrl's `Collector` over the "
                               "ALE vector env, in the child): a child process collects batch k+1 while the learner "
                               "learns on batch k (`offpolicy/collect/overlap.py`; the weights travel with each order "
                               "through shared memory, so a run repeats exactly). Uses a second core; one round of "
                               "policy lag: batch k is collected with policy version k-1 (the invariants check that "
                               "instead of k). Refused with `engine=ray` and with torchrl's `Collector` on other "
                               "envs. A dead child ends the run (exit 4, one line, checkpoint kept). Off by default: "
                               "on 2 cores it gains only where collection is most of a round (DQN at CleanRL's UTD "
                               "0.1, one learner thread) and costs a little in the default commands "
                               "([docs/results.md](results.md#collection-overlapped-with-learning))")
    overlap_timeout_s: int = key(600, "`collector.overlap`: a batch the loop has waited this many seconds for (its "
                                      "own learning in between not counted; the first wait includes the child's "
                                      "start) stops the child, which lives but sends nothing, and ends the run like a "
                                      "dead child", min=1)

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """A batch is whole steps of every env copy, and the prefill fits in the replay."""
        if cfg.collector.env_steps_per_batch % cfg.env.num_envs:
            raise ConfigError(f"collector.env_steps_per_batch={cfg.collector.env_steps_per_batch} is not allowed; "
                              f"allowed: a multiple of env.num_envs={cfg.env.num_envs}")
        if cfg.collector.prefill_env_steps > cfg.replay.size:
            raise ConfigError(f"collector.prefill_env_steps={cfg.collector.prefill_env_steps} is not allowed; allowed: "
                              f"<= replay.size={cfg.replay.size}")


@dataclass
class ModelConfig:
    hidden: list[int] = key([256, 256], "MLP hidden sizes of every actor / critic / Q network (Atari DQN: conv trunk "
                                        "+ 1 hidden)", check=_positive_ints("model.hidden"))
    activation: str = key('relu', 'relu | tanh | elu', choices=tuple(ACTIVATIONS))


@dataclass
class OptimConfig:
    utd_ratio: float = key(1.0, "update-to-data ratio: optimiser steps per collected transition. Each batch gets "
                                "utd_ratio * env_steps_per_batch steps (must be a positive integer), so profiles that "
                                "change env_steps_per_batch keep it; replayed samples per transition = batch_size * "
                                "utd_ratio", min=1e-09)
    batch_size: int = key(256, "transitions per optimiser step (`engine=ray`: the global batch, split evenly over the "
                               "ranks)", min=1, integer=True)
    replay_ratio: float | None = key(None, "stated samples replayed per collected transition; when set it must equal "
                                           "batch_size * utd_ratio (a profile's check on itself)",
                                           min=1e-12, nullable=True)
    lr: float = key(0.0003, 'actor learning rate (DQN: Q network)', min=1e-12)
    weight_decay: float = key(0.0, 'actor L2 weight decay (DQN: Q network)', min=0)
    max_grad_norm: float | None = key(None, "actor gradient-norm clip per optimiser step (DQN: Q network; null = no "
                                            "clipping)", min=1e-12, nullable=True)
    critic_lr: float = key(0.001, 'critic learning rate (SAC, TD3, DDPG: one Adam per network)', min=1e-12)
    critic_weight_decay: float = key(0.0, 'critic L2 weight decay', min=0)
    critic_max_grad_norm: float | None = key(None, "critic gradient-norm clip per optimiser step (null = no clipping)",
                                                   min=1e-12, nullable=True)

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """Each batch gets a whole number of optimiser steps, the first sample can be drawn, and a stated replay
        ratio is the one the keys give."""
        steps = cfg.optim.utd_ratio * cfg.collector.env_steps_per_batch
        if abs(steps - round(steps)) > 1e-6 or round(steps) < 1:
            raise ConfigError(f"optim.utd_ratio={cfg.optim.utd_ratio} gives {steps:g} optimiser steps per batch of "
                              f"collector.env_steps_per_batch={cfg.collector.env_steps_per_batch}; allowed: a "
                              "utd_ratio that makes it a positive integer")
        if not cfg.optim.batch_size <= max(cfg.collector.prefill_env_steps, cfg.collector.env_steps_per_batch):
            raise ConfigError(f"optim.batch_size={cfg.optim.batch_size} is not allowed; allowed: <= "
                              "max(collector.prefill_env_steps, collector.env_steps_per_batch), so the first sample "
                              "can be drawn")
        ratio = cfg.optim.batch_size * cfg.optim.utd_ratio
        if cfg.optim.replay_ratio is not None and abs(ratio - cfg.optim.replay_ratio) > 1e-6 * ratio:
            raise ConfigError(f"optim.replay_ratio={cfg.optim.replay_ratio} is not allowed; allowed: optim.batch_size "
                              f"* optim.utd_ratio = {ratio:g} (or null)")


@dataclass
class LossConfig:
    value_estimator: str = key('td0', "td0 | td1 | tdlambda: the critic's target (torchrl make_value_estimator). "
                                      "td1/tdlambda bootstrap along the stored sequence: use them with "
                                      "replay.slice_len (trajectory replay)", choices=('td0', 'td1', 'tdlambda'))
    gamma: float = key(0.99, 'discount', min=0, max=1)
    n_steps: int = key(1, "n-step returns (td0 only, every algorithm): a transition's target sums up to n discounted "
                          "rewards and bootstraps with γ^k from the observation k ≤ n steps later; the window stops "
                          "at a terminated, truncated or (Atari) life-losing step and at the end of a collected batch "
                          "(`offpolicy/replay/nstep.py`; torchrl's `MultiStepTransform` bootstraps from terminal "
                          "observations in 0.14.1)", min=1, max=255, integer=True)
    lmbda: float = key(0.95, 'TD(lambda) trace decay (tdlambda only)', min=0, max=1)
    function: str = key('l2', 'l2 | smooth_l1 (critic / Q regression)', choices=('l2', 'smooth_l1'))

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """td1 / tdlambda need trajectories; n-step windows fit in a batch and go with td0 only."""
        if cfg.loss.value_estimator != "td0" and not cfg.replay.slice_len:
            raise ConfigError(f"loss.value_estimator={cfg.loss.value_estimator} is not allowed without "
                              "replay.slice_len; allowed: td0, or set replay.slice_len so targets run along "
                              "trajectories")
        steps_per_env = (cfg.collector.env_steps_per_batch // cfg.env.num_envs
                         // engine_class(cfg.engine).collectors(cfg))
        if cfg.loss.n_steps > max(steps_per_env, 1):
            raise ConfigError(f"loss.n_steps={cfg.loss.n_steps} is not allowed; allowed: <= the {steps_per_env} steps "
                              "each env takes per collected batch (collector.env_steps_per_batch / env.num_envs / "
                              "collectors): windows stop at the batch's end")
        if cfg.loss.n_steps > 1 and (cfg.loss.value_estimator != "td0" or cfg.replay.slice_len):
            raise ConfigError(f"loss.n_steps={cfg.loss.n_steps} is not allowed with loss.value_estimator="
                              f"{cfg.loss.value_estimator} and replay.slice_len={cfg.replay.slice_len}; allowed: "
                              "n_steps > 1 with td0 and no slice_len (td1 / tdlambda already look further ahead)")


@dataclass
class TargetConfig:
    mode: str = key('soft', "soft: `target ← (1−τ)·target + τ·online` after every update; hard: exact copy every "
                            "`hard_every` updates", choices=('soft', 'hard'))
    tau: float = key(0.005, 'soft update rate', min=1e-09, max=0.5)
    hard_every: int = key(1000, "hard update period in updates (optimiser steps; TD3: actor steps, as targets move "
                                "with the actor)", min=1, integer=True)


@dataclass
class ReplayConfig:
    size: int = key(1000000, 'capacity in transitions (FIFO)', min=1, integer=True)
    storage: str = key('memory', "memory (`LazyTensorStorage`) or memmap (`LazyMemmapStorage`: files in "
                                 "`scratch_dir`, reopened on resume, a rerun into the same dir overwrites it)",
                                 choices=('memory', 'memmap'))
    scratch_dir: str | None = key(None, 'memmap files (null = `<run_dir>/replay`)')
    prioritized: bool = key(False, "prioritized replay: torchrl's `PrioritizedSampler` / `PrioritizedSliceSampler` on "
                                   "pure-torch segment trees (`offpolicy/replay/prioritized.py`); losses are "
                                   "importance-weighted, priorities follow the TD error after every step")
    alpha: float = key(0.7, 'prioritized: priority exponent', min=0)
    beta: float = key(0.5, 'prioritized: importance-weight exponent', min=0)
    slice_len: int | None = key(None, "trajectory replay: sub-trajectories of this many steps (`SliceSampler`), "
                                      "`batch_size / slice_len` of them per step, so the updates-per-env-step ratio "
                                      "is kept; needed by td1 / tdlambda", min=2, integer=True, nullable=True)
    frames_once: bool = key(False, "ALE games, `engine=local`, uniform replay in memory: store each 84×84 frame once "
                                   "and rebuild the 4-frame stacks (observation and next observation) when sampling, "
                                   "with zeros before an episode's first frame as ALE stacks them "
                                   "(`offpolicy/replay/frames.py`; 7,072 B per slot, 7,187 B per transition with the "
                                   "ring margin at `profile=atari`)")
    in_checkpoint: bool = key(False, "also save the replay buffer in checkpoints (resume then continues with the same "
                                     "data)")

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """Slices divide the batch; ``frames_once`` rebuilds ALE frame stacks from one in-memory stream per env,
        sampled uniformly."""
        if cfg.replay.slice_len and cfg.optim.batch_size % cfg.replay.slice_len:
            raise ConfigError(f"replay.slice_len={cfg.replay.slice_len} is not allowed; allowed: a divisor of "
                              f"optim.batch_size={cfg.optim.batch_size} (each step replays batch_size transitions)")
        if not cfg.replay.frames_once:
            return
        unsupported = {"env.name": None if cfg.env.kind == "atari" else cfg.env.name,
                       "engine": None if engine_class(cfg.engine).replay_in_process else cfg.engine,
                       "replay.storage": "memmap" if cfg.replay.storage == "memmap" else None,
                       "replay.prioritized": True if cfg.replay.prioritized else None,
                       "replay.slice_len": cfg.replay.slice_len,
                       "replay.size": (cfg.replay.size if cfg.replay.size < 2 * cfg.collector.env_steps_per_batch
                                       else None)}
        for name, value in unsupported.items():
            if value is not None:
                raise ConfigError(f"{name}={value!r} is not allowed with replay.frames_once=true; allowed: an ALE "
                                  "game, engine=local, replay.storage=memory, uniform replay (no prioritized, no "
                                  "slice_len), replay.size >= 2 x collector.env_steps_per_batch")


@dataclass
class EvalConfig:
    interval_env_steps: int = key(10000, "evaluate the deterministic policy every this many env steps, in a "
                                         "background thread that never blocks training (0 = only the final "
                                         "evaluation)", min=0, integer=True)
    episodes: int = key(5, 'games per periodic evaluation', min=1, integer=True)
    final_episodes: int = key(10, "episodes of the final evaluation, run after training (0 = none)",
                                  min=0, integer=True)
    max_episode_steps: int = key(1000, "cap on an evaluation episode's length (ALE games: whole games, to game over "
                                       "or the 108k-frame cap)", min=1, integer=True)
    stop_return: float | None = key(None, "stop training once a periodic evaluation's mean return reaches this (then "
                                          "the final evaluation runs as after a completed run; Tianshou's stop_fn, "
                                          "SB3's StopTrainingOnRewardThreshold); null = train for total_env_steps. An "
                                          "evaluation that finishes after the last round (the final one too) still "
                                          "counts; a resumed run keeps the record (summary.json stop_return_reached) "
                                          "and trains on to its total", nullable=True, number=True)
    video: bool = key(False, "MuJoCo / Gymnasium only: also write videos/eval-<env_steps>.mp4 of the first episode "
                             "(offscreen rendering with MUJOCO_GL=egl; needs the video extra)")


@dataclass
class LoggerConfig:
    backend: str = key('csv', "`csv`, `tensorboard` or `wandb` (CSV is always written; `WANDB_MODE=offline` works)",
                              choices=BACKENDS)
    interval_s: float = key(5.0, "loss/, collector/, replay/, time/ metrics are logged at most this often "
                                 "(train/return every batch that finished episodes, eval/ after each evaluation)",
                                 min=0)
    progress_bar: bool = key(True, 'tqdm bar with live metrics')


@dataclass
class CheckpointConfig:
    interval_s: int = key(600, "periodic checkpoint every this many seconds (0 = only the final one); Ctrl-C, the end "
                               "of the run and a failed env or collector also save one (a broken invariant keeps its "
                               "state in checkpoints/broken.pt instead, for inspection)", min=0)


@dataclass
class CompileConfig:
    enabled: bool | str = key('auto', "auto, true or false. true: run the learner's loss forward and backward under "
                                      "`torch.compile`: one compiled function per kind of step (TD3: critic only, or "
                                      "critic + actor), compiled in the first steps (seconds to tens of seconds on a "
                                      "CPU); the clips and the fused Adam steps stay eager (one kernel each already; "
                                      "compiled they were slower); a local collection policy on TensorDicts is "
                                      "compiled too (the "
                                      "plain-tensor policies run eager); `summary.json` and `compile/recompiles` "
                                      "count the learner's own recompilations after the warm-up (0 for every "
                                      "algorithm). auto (the default): true when the run's planned optimiser steps, "
                                      "`(total_env_steps - collector.prefill_env_steps) * optim.utd_ratio`, reach "
                                      "`compile.auto_min_optim_steps`, else false (every smoke profile is eager; "
                                      "SAC/TD3/DDPG's 1M-step defaults and DQN's `profile=atari` compile). Where "
                                      "`torch.compile` does not work (a probe compiles a small function first), or a "
                                      "step fails to compile, the run goes on eager with one `warning:` line naming "
                                      "the reason. The start line says which path runs and why",
                                      choices=('auto', True, False))
    auto_min_optim_steps: int = key(25000, "the planned optimiser steps from which `compile.enabled=auto` compiles: "
                                           "past them, the time compiling saves per step has repaid its one-off cost "
                                           "for every algorithm (the measurements: [docs/results.md](results.md#"
                                           "off-policy-engine), `benchmarks/offpolicy_update_cost.py` and "
                                           "`benchmarks/atari_dqn_update_cost.py`)", min=0, integer=True)
    mode: str | None = key(None, "torch.compile mode: null (its default), default, reduce-overhead, max-autotune, "
                          "max-autotune-no-cudagraphs; with `compile.skip_guards` the mode goes to torch.compile as "
                          "its inductor options (torch.compile takes a mode or options, not both)",
                          choices=COMPILE_MODES, nullable=True)
    skip_guards: bool = key(True, "keep only torch.compile's guards on tensors (the shapes, dtypes and strides of the "
                                  "sample and the networks) and on global switches (grad mode, default device); drop "
                                  "those on the loss's Python objects (its modules, TensorDict internals, constants: "
                                  "about a thousand a kind of step), whose check is a large share of a small "
                                  "compiled step (`guard_filter_fn`). Each kind of step has its own code object, so "
                                  "its own "
                                  "graphs. Unsafe in torch's sense: a change to those Python objects during the run "
                                  "would not be seen (nothing in the learner makes one); a sample of another shape "
                                  "still compiles a new graph. false keeps every guard; no effect without "
                                  "`compile.enabled`")
    cudagraphs: bool = key(False, "also replay the compiled step as a CUDA graph (tensordict `CudaGraphModule`); "
                                  "needs a CUDA learner without gradient averaging: `engine=ray ray.backend=nccl "
                                  "ray.world_size=1`")

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """An algorithm whose loss cannot be compiled is not asked to."""
        if cfg.compile.enabled is True and not algorithm(cfg.algo).compiles:
            raise ConfigError(f"compile.enabled=true is not allowed for {cfg.algo}; allowed: auto or false (its loss "
                              "does not run under torch.compile)")


@dataclass
class InvariantsConfig:
    check_every: int = key(1, "check the sampled-batch invariant on every this many optimiser steps (1 = all)",
                              min=1, integer=True)


@dataclass
class RayConfig:
    address: str | None = key(None, "null: start a local Ray bound to 127.0.0.1 with no dashboard | auto or "
                                    "host:port: attach to a running cluster")
    num_cpus: int | None = key(None, "local Ray: logical CPUs it offers (null = this machine's count)",
                                     min=1, integer=True, nullable=True)
    num_gpus: int | None = key(None, 'local Ray: GPUs it offers (null = detected)', min=0, integer=True, nullable=True)
    num_collectors: int = key(2, "collector actors; each steps env.num_envs envs, so a round of "
                                 "collector.env_steps_per_batch transitions is env.num_envs * num_collectors * T",
                                 min=1, integer=True)
    max_collector_restarts: int = key(3, "a collector actor that dies is replaced (fresh env seeds, current weights) "
                                         "this many times in a run; one more death ends the run (exit 4, checkpoint "
                                         "saved)", min=0, integer=True)
    collector_cpus: float = key(1.0, 'CPUs reserved per collector actor', min=0)
    collector_gpus: float = key(0.0, 'GPUs per collector actor (the policy then runs on it)', min=0)
    world_size: int = key(2, "learner ranks (DDP); each samples optim.batch_size / world_size per step",
                             min=1, integer=True)
    backend: str = key('gloo', 'gloo (CPU) | nccl (one whole GPU per rank: learner_gpus: 1)', choices=('gloo', 'nccl'))
    learner_cpus: float = key(1.0, 'CPUs reserved per learner rank', min=0)
    learner_gpus: float = key(0.0, 'GPUs per learner rank (nccl: 1)', min=0)
    prefetch: int = key(32, "batches a learner rank fetches per replay call (0 or 1 = one per call): amortises the "
                            "replay actor's round trip; uniform draws from a replay that does not change during a "
                            "round",
                            min=0, integer=True)
    setup_timeout_s: int = key(60, "actors that cannot be placed or connected within this fail the run with an error",
                                   min=1)
    step_timeout_s: int = key(600, 'a learner round (or a weight publication) taking longer fails the run', min=1)
    log_to_driver: bool = key(False, "forward the actors' stdout/stderr to this terminal")


@dataclass
class OffPolicyConfig:
    algo: str = key(DEFAULT_ALGO, "the algorithm: a module of offpolicy/algos/ (`--help` lists them); merges "
                                  "`configs/offpolicy/algo/<algo>.yaml`")
    profile: str | None = key(None, "smoke (seconds, CI) | local (real learning on this machine) | atari (DQN on "
                                    "Atari, CleanRL's dqn_atari settings) | ray_smoke (the Ray engine in seconds) | "
                                    "scale, humanoid_scale (the seed suite's scale: 4 GPU collectors, 4 NCCL ranks)")
    engine: str = key('local', "local: collector, replay and learner in this process | ray: collector actors write "
                               "into a replay actor and a group of ray.world_size learner ranks trains (section ray "
                               "below)", choices=tuple(ENGINES))
    env: EnvConfig = section(EnvConfig)
    total_env_steps: int = key(1000000, "stop after this many collected transitions (env steps summed over envs)",
                                        min=1, integer=True)
    threads: int | str = key('auto', "torch intra-op threads of the learner (engine=ray: of each learner rank). auto: "
                                     "every core it can have (local: this process's CPUs, or OMP_NUM_THREADS, less "
                                     "one with collector.overlap; ray: ray.learner_cpus): a second thread makes the "
                                     "learner step faster, most at the 256x256 MLPs' batch 256, and never slower "
                                     "([docs/results.md](results.md#off-policy-engine), the default command)",
                                     min=1, integer=True, auto=True)
    seed: int = key(0, "seeds torch, the training envs (copy i of collector k: seed + k*num_envs + i) and the "
                       "evaluation env (a stream of its own derived from the seed)", min=0, integer=True)
    collector: CollectorConfig = section(CollectorConfig)
    model: ModelConfig = section(ModelConfig)
    optim: OptimConfig = section(OptimConfig)
    loss: LossConfig = section(LossConfig)
    target: TargetConfig = section(TargetConfig)
    replay: ReplayConfig = section(ReplayConfig)
    eval: EvalConfig = section(EvalConfig)
    logger: LoggerConfig = section(LoggerConfig)
    checkpoint: CheckpointConfig = section(CheckpointConfig)
    compile: CompileConfig = section(CompileConfig, "the learner's optimiser step (loss, backward, clips, optimiser "
                                                    "steps, soft targets)")
    invariants: InvariantsConfig = section(InvariantsConfig)
    ray: RayConfig = section(RayConfig, 'engine=ray only')
    run_dir: str | None = key(None, 'where the run writes (default runs/offpolicy-<algo>-<env>-<time>)')
    resume: str | None = key(None, "a checkpoint: continue its counters, weights and optimizer state (its config, "
                                   "plus your overrides)")

    @staticmethod
    def check(cfg: DictConfig) -> None:
        """What the chosen engine can run (offpolicy/engines/)."""
        engine_class(cfg.engine).check_config(cfg)


HEADER = """Off-policy engine (DQN, C51, SAC, DDPG, TD3, CrossQ, REDQ): every common default, with what each key does.
Generated from offpolicy/config.py by `python -m offpolicy.config`: edit the declarations there, not this file.
The algorithm's section (declared in offpolicy/algos/<name>.py) and file (algo/<name>.yaml) are merged on top; a
profile (profile/<name>.yaml) rescales a run; key=value overrides come last:
  python -m offpolicy.train algo=sac env=Pendulum-v1 total_env_steps=20000 optim.utd_ratio=0.5
Short aliases: env= -> env.name=, lr= -> optim.lr=, utd= -> optim.utd_ratio=."""


def compose_config(argv: list[str]) -> tuple[DictConfig, Checkpoint | None]:
    """Compose and validate the config; with ``resume=PATH`` the checkpoint's config is the base. Returns
    ``(cfg, checkpoint or None)``."""
    overrides = parse_overrides(argv, ALIASES)
    if "env.kind" in overrides:
        raise ConfigError(f"env.kind={overrides['env.kind']!r} is not allowed; allowed: set env.name (env.kind is read "
                          "off it: atari, dmc or gymnasium)")
    resume = overrides.get("resume")
    checkpoint = Checkpoint.read(resume) if resume not in (None, "", "null") else None
    base = checkpoint.config if checkpoint is not None else None
    if base is not None and overrides.get("algo", base["algo"]) != base["algo"]:
        raise ConfigError(f"algo={overrides['algo']!r} differs from the resumed run's; allowed: {base['algo']}")
    name = overrides.get("algo", base["algo"] if base is not None else OffPolicyConfig.algo)
    if name not in ALGOS:
        raise ConfigError(f"algo={name!r} does not exist; allowed: {', '.join(sorted(ALGOS))}")
    algo = algorithm(name)
    cfg = compose(defaults(name), overrides, config_dir=CONFIG_DIR, groups=GROUPS, rules=rules(name), base=base)
    if not isinstance(cfg.env.name, str) or not cfg.env.name.strip():
        raise ConfigError(f"env.name={cfg.env.name!r} is not allowed; allowed: a Gymnasium id, module:EnvId, an ALE "
                          "game or dmc:<domain>-<task> (leave env out for the algorithm's default)")
    cfg.env.kind = env_kind(cfg.env.name)  # decided here once; every part of the run reads env.kind
    check_logger_backend(cfg.logger.backend)
    if checkpoint is not None:
        checkpoint.check_resumable(cfg)
    for check in schema.checks(algo.config) + schema.checks(OffPolicyConfig):
        check(cfg)
    return cfg, checkpoint


def rules(algo: str) -> dict:
    """What each key allows on its own (``key -> Rule``), the common keys and the algorithm ``algo``'s section; the
    checks across keys run after composition (``compose_config``)."""
    return {**schema.rules(OffPolicyConfig), **schema.rules(algorithm(algo).config, f"{algo}.")}


def defaults(algo: str) -> dict:
    """The declared defaults with the algorithm ``algo``'s section (before its file, a profile or overrides)."""
    return {**schema.defaults(OffPolicyConfig), algo: schema.defaults(algorithm(algo).config)}


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


def reference() -> str:
    """The commented YAML of every common key (configs/offpolicy/config.yaml, what ``--help`` prints)."""
    return schema.to_yaml(OffPolicyConfig, HEADER)


def write_reference() -> list[str]:
    """Rewrite the files generated from the declarations: configs/offpolicy/config.yaml and the off-policy tables
    of docs/config.md. Returns the paths written."""
    from offpolicy.evaluate import EVALUATE_HEADER, EvaluateConfig
    from shared.export import ExportConfig, export_header

    composed = {a: OmegaConf.to_container(compose_config([f"algo={a}"])[0]) for a in ALGOS}
    for config in composed.values():
        config["env"]["kind"] = None  # derived from env.name, not a default of its own
    docs = CONFIG_ROOT.parent / "docs" / "config.md"
    text = schema.replace_block(docs.read_text(), "offpolicy", schema.to_markdown(OffPolicyConfig, composed))
    sections = "".join(f"\n`{name}` ({algo.config.__doc__.strip()}; `configs/offpolicy/algo/{name}.yaml` sets the "
                       f"common keys it changes):\n\n{schema.to_markdown(algo.config, prefix=name + '.')}"
                       for name, algo in ALGORITHMS.items())
    text = schema.replace_block(text, "offpolicy-algorithms", sections)
    files = {CONFIG_DIR / "config.yaml": reference(), docs: text,
             CONFIG_DIR / "evaluate.yaml": schema.to_yaml(EvaluateConfig, EVALUATE_HEADER),
             CONFIG_DIR / "export.yaml": schema.to_yaml(ExportConfig, export_header("offpolicy"))}
    return [str(path) for path, content in files.items() if schema.write_if_changed(path, content)]


if __name__ == "__main__":
    print("\n".join(write_reference()) or "up to date")
