"""The one place a run's parts are made from its config (Acme's builder idea): the training and evaluation envs, the
algorithm's parts (offpolicy/algos/), the collector (in this process or in a Ray collector actor), the replay buffer and the learner. The entry point, both
engines and the rate probes (offpolicy/tools/rates.py) build through it, so a part is assembled the same way wherever it
runs; where it runs is the engine's choice (offpolicy/engines/)."""
from __future__ import annotations

import functools
from pathlib import Path

import torch
from omegaconf import DictConfig

from offpolicy import envs, replay
from offpolicy.algos import AlgoParts, algorithm
from offpolicy.algos.base import ActsOnTensors
from offpolicy.compiling import CompileChoice, compile_choice
from offpolicy.learner import SAMPLE_CHUNK, Learner, make_learner
from shared import compat


class Builder:
    """Builds the parts of the run ``cfg`` describes (a validated config)."""

    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    @functools.cached_property
    def compile(self) -> CompileChoice:
        """Whether the collector's policy and the learner step run under torch.compile, decided once (on first use:
        a builder that only makes envs or parts never asks, so it never probes the compiler)."""
        return compile_choice(self.cfg)

    def train_env(self, obs_norm: dict | None = None, *, seed: int | None = None, num_envs: int | None = None):
        """The training env (offpolicy/envs.py): ``num_envs`` copies (default ``env.num_envs``) seeded with ``seed``
        (default ``cfg.seed``), observations standardised with ``obs_norm`` (a resumed run's statistics) when
        ``env.obs_norm``."""
        return envs.make_train_env(self.cfg, obs_norm, seed=seed, num_envs=num_envs)

    def eval_env(self, *, render: bool = False, obs_norm: dict | None = None):
        """The evaluation env: one copy, seeded apart from training; Atari plays whole games."""
        return envs.make_eval_env(self.cfg, render=render, obs_norm=obs_norm)

    def parts(self, specs, device: torch.device = torch.device("cpu")) -> AlgoParts:
        """The algorithm's networks, policies, exploration, loss, optimisers and target updates for ``specs``
        (anything with torchrl ``*_spec_unbatched``), for a learner computing on ``device`` (the engine's
        ``learner_device``; the CPU for evaluation and export), after checking that the env's actions suit it. Every
        path that builds an algorithm's parts comes here (training, both engines' actors and ranks, evaluation and
        export of a checkpoint, the tools): what must hold before a torchrl loss is built is done here, for every
        algorithm."""
        algo = algorithm(self.cfg.algo)
        algo.check_actions(self.cfg.env.name, specs.action_spec_unbatched)
        # the losses' Q-ensemble loop without tensordict's pytree edits, which made a compiled learner step recompile
        # on every call (shared/compat.py); looked up when a loss is built, so before ``build``
        compat.pseudo_vmap_without_pytree_edits()
        return algo.build(self.cfg, specs, device)

    def collector(self, env, policy, seed: int | None = None, *, env_steps_per_batch: int | None = None,
                  policy_device: torch.device | None = None):
        """A collector running the stochastic ``policy`` on ``env`` (seeded by the caller), batches of
        ``env_steps_per_batch`` transitions (default ``collector.env_steps_per_batch``; a Ray collector actor takes
        its share): our :class:`~offpolicy.collect.lean.LeanCollector` where it applies (then seeded ``seed``, default
        ``cfg.seed``, and ``env`` gives only its specs and observation statistics), else torchrl's ``Collector``
        (with the policy on ``policy_device``: a Ray collector's GPU). Transitions carry the ``policy_version`` they
        were collected with (bumped by every weight publication). When the run compiles the policy runs under
        torch.compile too (it shortened a CartPole step of DQN's TensorDict policy), except a policy the lean collector
        runs on plain tensors (cheaper eager than either)."""
        from offpolicy.collect.lean import LeanCollector, lean_collection

        cfg = self.cfg
        steps = cfg.collector.env_steps_per_batch if env_steps_per_batch is None else env_steps_per_batch
        if lean_collection(cfg, policy_on_cpu=policy_device is None or policy_device.type == "cpu"):
            if self.compile.enabled and not isinstance(policy, ActsOnTensors):  # a tensor path runs eager
                policy = torch.compile(policy, mode=cfg.compile.mode)
            return LeanCollector(cfg, env, policy, cfg.seed if seed is None else seed, envs.obs_norm_state(env), steps)
        from torchrl.collectors import Collector
        from torchrl.envs.llm.transforms import PolicyVersion
        from torchrl.envs.utils import ExplorationType

        compiled = ({"mode": cfg.compile.mode} if cfg.compile.mode else True) if self.compile.enabled else False
        # an explicit PolicyVersion: track_policy_version=True refuses batched (Serial/Parallel) envs
        return Collector(env, policy, frames_per_batch=steps, total_frames=-1,
                         exploration_type=ExplorationType.RANDOM, track_policy_version=PolicyVersion(),
                         auto_register_policy_transforms=False, compile_policy=compiled,
                         policy_device=policy_device, env_device="cpu" if policy_device is not None else None,
                         storing_device="cpu" if policy_device is not None else None)

    def replay(self, run_dir: Path | None = None):
        """The replay buffer of this process (offpolicy/replay/); a memmap one keeps its files under ``run_dir``
        unless ``replay.scratch_dir`` says where."""
        return replay.make_replay_buffer(self.cfg, run_dir)

    def learner(self, parts: AlgoParts, action_spec, *, world_size: int = 1, grad_sync=None,
                chunk: int = SAMPLE_CHUNK, device: torch.device | None = None,
                overlap_sampling: bool = False) -> Learner:
        """The learner over ``parts``, one of ``world_size`` ranks (each samples ``batch_size / world_size``;
        ``grad_sync`` averages their gradients; ``overlap_sampling``: replay in another process)."""
        return make_learner(self.cfg, parts, action_spec, sample_shape=replay.sample_shape(self.cfg, world_size),
                            grad_sync=grad_sync, chunk=chunk, device=device, overlap_sampling=overlap_sampling,
                            compiled=self.compile.enabled)
