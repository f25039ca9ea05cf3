"""The off-policy checkpoint, one object for both engines: what a checkpoint holds, how it is written (atomically, at a
round boundary, with its :data:`FORMAT_VERSION`), read (``weights_only``; a file of an older format brought to the
current one by :data:`MIGRATIONS`, the only place that knows older layouts), checked against the config that resumes
it, and restored into a new run's parts."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf

from offpolicy.algos import AlgoParts, algorithm
from offpolicy.replay import replay_scratch_dir
from shared.checkpoint import load_checkpoint, resumed_config, save_checkpoint
from shared.config import ConfigError, check_kept_on_resume
from shared.envs import env_kind

FORMAT_VERSION = 2  # written into every checkpoint; a file without one is version 0

# what the checkpoint's networks and optimisers were built for: a resume cannot change them
# (env.obs_norm: the networks learned on raw or on standardised inputs; loss.value_estimator: the loss's state keys)
SHAPE_KEYS = ("model.hidden", "model.activation", "env.name", "env.from_pixels", "env.image_size",
              "env.atari.frame_stack", "env.atari.image_size", "env.obs_norm",
              "loss.value_estimator")  # and the algorithm's own (Algorithm.shape_keys)
# what a saved replay was written with: a resume that restores it cannot change them (the sampler's layout too)
REPLAY_KEYS = ("loss.n_steps", "replay.frames_once", "replay.prioritized", "replay.slice_len")


class Checkpoint:
    """One checkpoint file's content: ``config``, ``counters`` and ``learner`` (always), the exploration state, the
    observation statistics, the replay (``replay.in_checkpoint`` or a memmap replay) and torch's RNG state."""

    KEYS = ("config", "counters", "learner")  # a file without them is not an off-policy checkpoint (A3C's lacks them)

    def __init__(self, state: dict, config: dict):
        self.state = state
        self.config = config  # the run's config with today's key names, continuing in the checkpoint's run dir

    @classmethod
    def read(cls, path: str | Path, key: str = "resume") -> "Checkpoint":
        """Load ``path`` (given as ``key=``); anything wrong with the file is one ConfigError naming ``key``."""
        state = migrate(load_checkpoint(path, key=key, required=cls.KEYS, written_by="offpolicy.train",
                                        format_version=FORMAT_VERSION))
        if state.get("broken"):
            raise ConfigError(f"{key}={str(path)!r} is the state at a broken invariant ({state['broken']}), kept for "
                              "inspection; allowed: the run's checkpoints/last.pt (its last whole round)")
        return cls(state, resumed_config(state["config"], path))

    @property
    def counters(self) -> dict:
        return self.state["counters"]

    @property
    def obs_norm(self) -> dict | None:
        return self.state["obs_norm"]

    @staticmethod
    def write(path: Path, cfg: DictConfig, *, counters: dict, engine, exploration, obs_norm: dict | None,
              broken: str | None = None) -> Path:
        """Atomically write everything a resume needs (at a round boundary: the counters match the learner);
        ``broken``: the invariant the state broke (such a file is for inspection; :meth:`read` refuses it)."""
        keep_replay = cfg.replay.in_checkpoint or cfg.replay.storage == "memmap"
        state = {
            "format_version": FORMAT_VERSION,
            "broken": broken,
            "config": OmegaConf.to_container(cfg, resolve=True),
            "counters": counters,
            "learner": engine.learner_state(),
            "exploration": exploration.state_dict() if exploration is not None else None,
            "obs_norm": obs_norm,
            "replay": engine.replay_state() if keep_replay else None,
            "rng": torch.get_rng_state(),
        }
        return save_checkpoint(path, state)

    def eval_env(self, *, render: bool = False):
        """The run's evaluation env (one copy, its own seed stream), observations standardised with the checkpoint's
        statistics as in training (``Builder(cfg).eval_env()`` without ``obs_norm=`` would leave them raw)."""
        from offpolicy.builder import Builder

        return Builder(OmegaConf.create(self.config)).eval_env(render=render, obs_norm=self.obs_norm)

    def parts(self, specs) -> AlgoParts:
        """The run's algorithm parts with the checkpoint's learned weights, for an env with ``specs`` (its evaluation
        env): its evaluation policy (:attr:`AlgoParts.eval_policy`) and that policy on plain tensors
        (:attr:`AlgoParts.eval_tensor_policy`, what ``offpolicy.export`` writes) take observations as that env gives
        them (with ``env.obs_norm``: standardised by :attr:`obs_norm`)."""
        from offpolicy.builder import Builder

        parts = Builder(OmegaConf.create(self.config)).parts(specs)
        parts.loss.load_state_dict(self.state["learner"]["loss"])
        return parts

    def eval_policy(self, specs):
        """The run's deterministic evaluation policy (the loss's actor, the greedy Q network for DQN) with the
        checkpoint's weights, for an env with ``specs`` (its evaluation env), as :meth:`parts` gives it."""
        return self.parts(specs).eval_policy

    def check_resumable(self, cfg: DictConfig) -> None:
        """``cfg`` (the resume's) keeps the networks' shapes and, with a saved replay, its layout; a memmap replay finds
        its files (or the run resumes without it: ``replay.storage=memory``, refilled by the prefill)."""
        saved = OmegaConf.create(self.config)
        check_kept_on_resume(cfg, saved, SHAPE_KEYS + algorithm(cfg.algo).shape_keys,
                             "the checkpoint's networks and loss were built for it")
        if self.state.get("replay") is None:
            return
        keys = [*REPLAY_KEYS, *(("loss.gamma",) if cfg.loss.n_steps > 1 else ()),
                *(("replay.size", "env.num_envs") if cfg.replay.frames_once else ())]
        check_kept_on_resume(cfg, saved, keys, "its saved replay was written with it")  # n-step, own frame layout
        if saved.replay.storage == cfg.replay.storage == "memmap":
            scratch = replay_scratch_dir(cfg, Path(cfg.run_dir))
            if not (scratch / "meta.json").exists():
                raise ConfigError(f"replay.scratch_dir={str(scratch)!r}: the resumed run's replay files are gone; "
                                  "allowed: that directory with its files, or replay.storage=memory (resume with an "
                                  "empty replay, refilled by the prefill)")

    def restore(self, engine, exploration, *, storage: str, version: int) -> None:
        """Load the learner, exploration, replay (when saved with this run's ``replay.storage``; else the run resumes
        with an empty replay) and RNG state; the collectors continue from policy version ``version``."""
        state = self.state
        if exploration is not None:
            exploration.load_state_dict(state["exploration"])
        if state["replay"] is not None and self.config["replay"]["storage"] == storage:
            engine.restore_replay(state["replay"])
        engine.restore(state["learner"], version=version)
        torch.set_rng_state(state["rng"])


def migrate(state: dict) -> dict:
    """``state`` (a checkpoint's, of any format up to :data:`FORMAT_VERSION`) in the current format: each migration
    from its version on applied in turn. The rest of the code reads the current format only."""
    version = state.get("format_version", 0)
    for step in MIGRATIONS[version:]:
        state = step(state)
    return {**state, "format_version": FORMAT_VERSION}


# Version 0 (no format_version) named the off-policy counts of env steps "frames" (as A3C's emulator frames), and
# lacked keys added since. Its runs used the values below for those keys: a resume keeps them, where a profile's value
# today would change the resumed run's recipe. These tables are version 0's layout, fixed: new keys and renames go into
# a new version's migration.
V0_RENAMED = {"total_frames": "total_env_steps", "collector.frames_per_batch": "collector.env_steps_per_batch",
              "collector.prefill_frames": "collector.prefill_env_steps",
              "eval.interval_frames": "eval.interval_env_steps", "dqn.eps_anneal_frames": "dqn.eps_anneal_env_steps",
              "ddpg.anneal_frames": "ddpg.anneal_env_steps", "td3.anneal_frames": "td3.anneal_env_steps"}
V0_ADDED = {"loss.n_steps": 1, "replay.frames_once": False, "dqn.dueling": False, "dqn.conv_precision": "float32"}


def _from_version_0(state: dict) -> dict:
    """Version 0 -> 1: the config's renamed keys under their current names, the added keys at the values those runs
    used (``env.kind`` read off the env's name as a composed config reads it; an algorithm's keys only in its own
    section), the counters' ``collected_frames`` as ``env_steps`` and ``stop_return_reached`` (None: not reached)."""
    config = OmegaConf.create(state["config"])
    for old, new in V0_RENAMED.items():
        if OmegaConf.select(config, old) is not None:
            OmegaConf.update(config, new, OmegaConf.select(config, old))
            parent, _, leaf = old.rpartition(".")
            del (OmegaConf.select(config, parent) if parent else config)[leaf]
    if OmegaConf.select(config, "env.kind") is None:
        config.env.kind = env_kind(config.env.name)
    for key, value in V0_ADDED.items():
        section = key.partition(".")[0]
        if OmegaConf.select(config, key) is None and (section in ("loss", "replay") or section == config.get("algo")):
            OmegaConf.update(config, key, value)
    counters = dict(state["counters"])
    if "collected_frames" in counters:
        counters["env_steps"] = counters.pop("collected_frames")
    counters.setdefault("stop_return_reached", None)
    return {**state, "config": OmegaConf.to_container(config), "counters": counters}


def _from_version_1(state: dict) -> dict:
    """Version 1 -> 2: version 1 had no uniform prefill, so an algorithm with action noise (a ``random_prefill`` key
    today) gets ``random_prefill`` false (what its run did) and its noise module's ``random_env_steps_left`` zero in
    the exploration state (a resumed run refills with the actor)."""
    config = OmegaConf.create(state["config"])
    section = config.get("algo")
    if "random_prefill" not in {f.name for f in dataclasses.fields(algorithm(section).config)}:
        return state
    if OmegaConf.select(config, f"{section}.random_prefill") is None:
        OmegaConf.update(config, f"{section}.random_prefill", False)
    exploration = state.get("exploration")
    if exploration is not None:
        exploration = {**exploration, "random_env_steps_left": torch.tensor(0, dtype=torch.int64)}
    return {**state, "config": OmegaConf.to_container(config), "exploration": exploration}


# MIGRATIONS[v]: a checkpoint of format version v -> version v + 1
MIGRATIONS: tuple[Callable[[dict], dict], ...] = (_from_version_0, _from_version_1)
