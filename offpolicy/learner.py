"""The learner: optimiser steps on replayed batches. One object does the same work in the training process
(``engine=local``) and in every Ray learner rank (``engine=ray``, where ``grad_sync`` averages the gradients over the
ranks with ``torch.distributed``).

One step: sample, check the sample (shape, keys, no transition from a policy newer than the learner's), forward the
torchrl loss, one backward of the due optimisers' terms, each due optimiser clips its own gradients to its own norm
and steps, the target networks move, and the TD error is written back as the replay priority (prioritized replay).

When the run compiles (``compile.enabled``, offpolicy/compiling.py) the loss's forward and backward run under ``torch.compile``, one compiled function (and code
object, so one cache of graphs) per kind of step (TD3: critic only, or critic + actor), by default guarded on its
tensors and global switches only (``compile.skip_guards``), and with ``compile.cudagraphs`` the whole step (forward, backward,
clips, optimiser steps, soft target update) is replayed as a CUDA graph (tensordict's ``CudaGraphModule``).
Recompilations of the learner's own step functions after the warm-up steps are counted (:attr:`Learner.recompiles`).
A compiled step that fails to compile falls back to eager, with one warning line.
"""
from __future__ import annotations

import dataclasses
import itertools
import sys
import types
from collections import defaultdict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from math import lcm
from typing import Callable

import torch
from tensordict import TensorDictBase

from offpolicy.algos.base import AlgoParts
from offpolicy.compiling import compile_choice, describe_failure
from offpolicy.invariants import InvariantError, check_sample_batch
from offpolicy.metrics import action_stats
from offpolicy.network_updates import OptimGroup
from shared import compat, denormals

# Uniform samples of a round are drawn this many batches per replay call and split: the same i.i.d. draws as one
# call per batch (replay does not change during a round's updates), minus most of the per-call cost (large from a Ray
# rank, whose replay is another process, and not small in process).
SAMPLE_CHUNK = 32
IMPLEMENTATION_FLAGS = ("fused", "foreach", "capturable")  # how an optimiser steps, not what it learned


@dataclass(frozen=True)
class CompileOptions:
    """The ``compile`` config section: ``torch.compile`` of the learner step (``mode``: torch.compile's mode, None for
    its default), only the guards on tensors and global switches (``skip_guards``: :func:`tensor_and_global_guards`)
    and, on a CUDA learner, CUDA graphs over the compiled step."""

    enabled: bool = False
    mode: str | None = None
    skip_guards: bool = True
    cudagraphs: bool = False


@dataclass(frozen=True)
class Sampling:
    """How a learner draws from replay: batches of ``shape`` (``[batch]``, or ``[batch / slice_len, slice_len]`` for
    sliced replay), ``chunk`` batches per replay call (one for prioritized and sliced replay); ``prioritized``: the TD
    errors go back as priorities after every step; ``overlap`` (a Ray learner rank: replay is another process, a round
    trip a call): the next chunk is requested from a background thread while the current chunk is learned on, within a
    round (replay does not change during a round's updates, so the draws are those of sampling in turn)."""

    shape: tuple[int, ...]
    chunk: int = SAMPLE_CHUNK
    prioritized: bool = False
    overlap: bool = False

    def __post_init__(self):
        if self.overlap and self.prioritized:
            raise ValueError("overlap_sampling needs uniform replay: priorities change after every step")


# the guards a compiled step keeps with compile.skip_guards: the shapes, dtypes, strides and devices of its tensors
# (the sample's and the networks') and the global switches (grad mode, default device, ...)
KEPT_GUARDS = frozenset({"TENSOR_MATCH", "NO_TENSOR_ALIASING", "GLOBAL_STATE", "DEFAULT_DEVICE", "TORCH_FUNCTION_STATE",
                         "GRAD_MODE"})


def tensor_and_global_guards(entries) -> list[bool]:
    """A torch.compile ``guard_filter_fn``: keep the guards of :data:`KEPT_GUARDS`, drop those on the loss's Python
    objects (its modules, TensorDict internals, constants: about a thousand a kind of step for TD3, most of its guard
    check's time). Unsafe in torch's sense: a change to those objects after the first compile is not
    seen, which holds in a learner (its loss, networks and keys are fixed for a run); a sample of another shape or
    dtype still compiles a new graph."""
    return [entry.guard_type in KEPT_GUARDS for entry in entries]


_step_kinds = itertools.count()  # numbers the compiled step functions of this process


def _own_code(fn: Callable, kind: str) -> Callable:
    """``fn`` with a code object of its own, named after its ``kind`` of step and numbered: torch.compile keeps its
    graphs (and its automatic-dynamic-shape records) per code object, and equal code objects share them. So each kind
    of step of each learner gets its own cache: a lookup checks one entry's guards, not another kind's first; filtered
    guards (``compile.skip_guards``) never have to tell the kinds apart; and a second learner in the process (a test,
    a benchmark) neither reuses nor recompiles the first one's graphs."""
    name = f"{kind}_{next(_step_kinds)}"
    code = fn.__code__.replace(co_name=name, co_qualname=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


def _done_future(fn: Callable, *args) -> Future:
    """``fn(*args)`` run now, as a finished Future (the learner's samples when they are not overlapped)."""
    future: Future = Future()
    future.set_result(fn(*args))
    return future


def abs_td_error(td_error: torch.Tensor, *, squared: bool) -> torch.Tensor:
    """``|delta|`` from what a torchrl loss wrote as ``"td_error"`` (``delta^2`` when ``squared``)."""
    return td_error.sqrt() if squared else td_error.abs()


class Learner:
    """Runs optimiser steps of one algorithm's torchrl loss (its ``parts``) over its :class:`OptimGroup` optimisers, on
    batches drawn from replay as ``sampling`` says; checks every ``check_every``-th sample; computes on ``device``
    (None: where the loss lives; replay stays on the CPU); ``action_bounds``: for the replayed actions' statistics;
    ``grad_sync`` averages the gradients of Ray learner ranks.

    The parts' ``critic_only`` (TD3, CrossQ: the loss's critic term alone) runs on steps where only the critic is
    due, skipping the actor loss's forward; the target networks move on steps where a group with ``moves_targets``
    stepped (TD3: the actor's). The losses detach what each term must not train, so one summed backward equals
    separate ones.

    Each kind of step (which optimisers are due, whether soft targets move) gets its own step function, built once:
    eager, or compiled (``compile``). Every kind has run twice after ``warmup_steps`` (the optimisers' states exist
    from their first step on), so a graph built after that is a recompilation (:attr:`recompiles`).
    """

    def __init__(self, parts: AlgoParts, sampling: Sampling, *, check_every: int = 1,
                 device: torch.device | None = None, action_bounds: tuple[torch.Tensor, torch.Tensor] | None = None,
                 grad_sync=None, compile: CompileOptions = CompileOptions()):
        self.loss, self.groups, self.target_updater = parts.loss, parts.groups, parts.target_updater
        self.critic_only, self.critic_loss_key = parts.critic_only, parts.critic_loss_key
        self.td_error_squared = parts.td_error_squared
        self.sample_shape = tuple(sampling.shape)
        self.prioritized = sampling.prioritized
        self.chunk = sampling.chunk  # batches per replay call
        self._fetch = (ThreadPoolExecutor(1, thread_name_prefix="replay-sample").submit if sampling.overlap
                       else _done_future)
        self.device = device  # where the loss lives (a GPU learner rank); replay stays on the CPU
        self.check_every = check_every
        self.action_bounds = action_bounds
        self.grad_sync = grad_sync
        self.steps = 0  # optimiser steps so far (checkpointed: TD3's actor keeps its phase on resume)
        self.due: list[OptimGroup] = []
        self.compile = compile
        if compile.cudagraphs and (device is None or device.type != "cuda" or grad_sync is not None):
            raise ValueError("compile.cudagraphs needs a learner on a CUDA device without gradient averaging")
        self._step_fns: dict[tuple, Callable] = {}
        self._compiled_fns: list[Callable] = []  # the step functions torch.compile compiles (their own code objects)
        self.warmup_steps = 2 * lcm(*(g.every for g in self.groups))
        self._steps_here = 0  # steps run by this object (a resumed learner warms up again)
        self._compilations_after_warmup: int | None = None
        # values not computed on a step (TD3's actor loss between actor updates) repeat their latest one
        self._latest: dict[str, torch.Tensor] = {}
        if self.target_updater is not None:
            self.target_updater.init_()

    # --- one round ---------------------------------------------------------------------------------------------
    def update(self, replay, n_steps: int, version: int, stop: Callable[[], bool] | None = None) -> dict[str, float]:
        """``n_steps`` optimiser steps on batches from ``replay``; ``version`` is the newest policy version a sampled
        transition may carry; ``stop()`` true ends the round early, between two whole steps (a stop-now: the counters
        then hold what ran). Returns ``loss/`` means over the round and ``replay/`` statistics of its last sample."""
        sums: dict[str, list[torch.Tensor]] = defaultdict(list)
        sample = None
        with denormals.flushing():  # subnormal optimiser state costs a microcode assist per value (shared/denormals.py)
            for sample in self._samples(replay, n_steps):
                if stop is not None and stop():
                    break
                for key, value in self.step(sample, version).items():
                    sums[key].append(value)
                if self.prioritized:
                    self.write_priorities(replay, sample)
        if not sums:
            return {}
        out = {f"loss/{k}": float(torch.stack(v).mean()) for k, v in sums.items()}
        low, high = self.action_bounds if self.action_bounds is not None else (None, None)
        out.update({f"replay/{k}": v for k, v in action_stats(sample["action"].cpu(), low, high).items()})
        out["replay/reward"] = float(sample["next", "reward"].float().mean())
        steps = sample.get("steps_to_next_obs", None)  # n-step replay: the mean window length k <= loss.n_steps
        if steps is not None:
            out["replay/steps_to_next_obs"] = float(steps.float().mean())
        if self.recompiles is not None:
            out["compile/recompiles"] = float(self.recompiles)
        return out

    def _samples(self, replay, n_steps: int):
        batch = self.sample_shape[0] * (self.sample_shape[1] if len(self.sample_shape) > 1 else 1)
        chunks = [min(self.chunk, n_steps - done) for done in range(0, n_steps, self.chunk)]
        pending = self._fetch(replay.sample, batch * chunks[0]) if chunks else None
        for i, k in enumerate(chunks):
            drawn = pending.result()
            if i + 1 < len(chunks):  # the next chunk is drawn while this one is learned on (overlap_sampling)
                pending = self._fetch(replay.sample, batch * chunks[i + 1])
            if self.device is not None:
                drawn = drawn.to(self.device, non_blocking=True)
            for sample in (drawn.split(batch) if k > 1 else (drawn,)):
                yield sample.reshape(self.sample_shape) if len(self.sample_shape) > 1 else sample

    def write_priorities(self, replay, sample: TensorDictBase) -> None:
        """Give the sampled transitions the priority ``|delta|`` (the sampler makes it ``(|delta| + eps)^alpha``,
        Schaul et al. 2016), the same for every algorithm: torchrl's DQN, DDPG and TD3 losses write ``delta^2``."""
        sample.set("td_error", abs_td_error(sample.get("td_error"), squared=self.td_error_squared))
        replay.update_tensordict_priority(sample.reshape(-1))  # sliced batches are [n, slice_len]

    def check(self, sample: TensorDictBase, version: int) -> None:
        """The sampled-batch invariants: configured shape, the keys the losses read, no transition from a newer
        policy than ``version``."""
        check_sample_batch(sample, shape=self.sample_shape)
        newest = sample.get(("next", "policy_version"), None)
        if newest is not None and int(newest.max()) > version:
            raise InvariantError(f"sampled a transition of policy_version {int(newest.max())} on a learner at "
                                 f"version {version}")

    # --- one step ----------------------------------------------------------------------------------------------
    def step(self, sample: TensorDictBase, version: int | None = None) -> dict[str, torch.Tensor]:
        """One optimiser step on ``sample`` with its target update; returns the detached scalar loss terms and
        pre-clip gradient norms."""
        self.steps += 1
        if version is not None and self.steps % self.check_every == 0:
            self.check(sample, version)
        self.due = [g for g in self.groups if self.steps % g.every == 0]
        targets_due = self.target_updater is not None and any(g.moves_targets for g in self.due)
        soft = targets_due and self.target_updater.soft
        kind = (tuple(g.name for g in self.due), soft)
        try:
            losses = self._step_function(*kind)(sample)
        except Exception as exc:
            if not self.compile.enabled or self.compile.cudagraphs:
                raise
            self._fall_back_to_eager(exc)  # then the same step eagerly: a failure of its own is raised
            losses = self._step_function(*kind)(sample)
        if targets_due and self.target_updater.tick() and not soft:
            self.target_updater.move_()  # a hard copy every hard_every updates: eager, outside the compiled step
        for key, value in losses.items():
            self._latest[key] = value
        self._count_graphs()
        return self._latest

    def _fall_back_to_eager(self, exc: Exception) -> None:
        """A compiled step failed (a compiler error, an op the platform cannot compile): every kind of step runs eager
        from now on. The failed step made no optimiser step (compilation fails in the forward or the backward), and the
        gradients it may have left are dropped."""
        print(f"warning: the compiled learner step failed ({describe_failure(exc)}); the learner runs eager from here",
              file=sys.stderr, flush=True)
        for group in self.groups:
            group.optimizer.zero_grad(set_to_none=True)
        self.compile = dataclasses.replace(self.compile, enabled=False)
        self._step_fns.clear()
        self._compiled_fns.clear()
        self._compilations_after_warmup = None

    def _step_function(self, due: tuple[str, ...], soft_targets: bool):
        """``sample -> losses and gradient norms`` for one kind of step, built on first use."""
        key = (due, soft_targets)
        if key not in self._step_fns:
            self._step_fns[key] = self._build_step_function([g for g in self.groups if g.name in due], soft_targets)
        return self._step_fns[key]

    def _build_step_function(self, groups: list[OptimGroup], soft_targets: bool):
        keys = sorted({k for g in groups for k in g.loss_keys})
        critic_only = self.critic_only if keys == [self.critic_loss_key] else None
        loss, updater, grad_sync = self.loss, self.target_updater, self.grad_sync

        def forward(sample: TensorDictBase) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
            if critic_only is not None:
                value, td_error = critic_only(sample)
                losses = {self.critic_loss_key: value}
                sample.set("td_error", td_error)
            else:
                losses = dict(loss(sample).items())
            scalars = {k: v.detach() for k, v in losses.items() if v.numel() == 1}  # DDPGLoss adds per-sample values
            return sum(losses[k] for k in keys), scalars

        def apply() -> dict[str, torch.Tensor]:
            norms = {}
            for group in groups:
                if group.max_grad_norm is None:  # the norm is logged; with no clip, no pass that scales by 1
                    norms[f"grad_norm_{group.name}"] = torch.nn.utils.get_total_norm(
                        [p.grad for p in group.params() if p.grad is not None])
                else:
                    norms[f"grad_norm_{group.name}"] = torch.nn.utils.clip_grad_norm_(group.params(),
                                                                                      group.max_grad_norm)  # pre-clip
                group.optimizer.step()
                group.optimizer.zero_grad(set_to_none=True)
            if soft_targets:
                updater.move_()
            return norms

        if self.compile.enabled:
            # the clips and optimiser steps stay eager: the fused Adam kernel is one call already (compiled, SAC's
            # three groups were slower), and torch.optim's own graph breaks (its step's no-grad switch) inside the
            # loop over groups made dynamo give up on the whole function anyway
            # backward() stays outside: inside, it broke the graph, and the rest of the function ran as a second
            # compiled frame with its own guard lookup, a frame overhead on every step
            kind = "_".join(["forward", *(g.name for g in groups), *(["soft_targets"] if soft_targets else [])])
            mode, options = self.compile.mode, None
            if self.compile.skip_guards:  # torch.compile takes a mode or options: the mode goes in as its options
                mode, options = None, {**compat.compile_mode_options(mode), "guard_filter_fn": tensor_and_global_guards}
            # torchrl's losses set some attributes on first use: set them now, eagerly. Traced instead, a fully
            # guarded step (CrossQ's) reads its in_keys unset and compiles a second time on its next call, and SAC's
            # target entropy (a buffer its first use registers in place of the setting) has every compiled call
            # replay that swap as a deletion, so the checkpoint after the next one failed (no `target_entropy`)
            getattr(loss, "in_keys", None)
            getattr(loss, "target_entropy", None)
            forward = _own_code(forward, kind)
            self._compiled_fns.append(forward)
            forward = torch.compile(forward, mode=mode, options=options)

        def step(sample: TensorDictBase) -> dict[str, torch.Tensor]:
            total, losses = forward(sample)
            total.backward()
            if grad_sync is not None:  # the ranks' gradients averaged between backward and the optimiser steps
                grad_sync([p for group in groups for p in group.params()])
            return {**losses, **apply()}

        if self.compile.cudagraphs:
            from tensordict.nn import CudaGraphModule

            return CudaGraphModule(step, warmup=self.warmup_steps)  # __init__ checked: CUDA, no grad_sync
        return step

    def _count_graphs(self) -> None:
        self._steps_here += 1
        if self.compile.enabled and self._steps_here == self.warmup_steps:
            self._compilations_after_warmup = self._compilations()

    def _compilations(self) -> int:
        return sum(compat.compilations_of(fn) for fn in self._compiled_fns)

    @property
    def recompiles(self) -> int | None:
        """Compilations of this learner's step functions after the warm-up steps (0 when every step reuses its
        compiled graphs; other compiled functions of the process do not count); None when the step is not compiled
        or still warming up."""
        if self._compilations_after_warmup is None:
            return None
        return self._compilations() - self._compilations_after_warmup

    # --- checkpoints -------------------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        """Networks (with targets and SAC's temperature), optimisers, step and target-update counters."""
        return {"loss": self.loss.state_dict(),
                "optimizers": {g.name: g.optimizer.state_dict() for g in self.groups},
                "steps": self.steps,
                "target_updates": self.target_updater.updates if self.target_updater is not None else 0}

    def load_state_dict(self, state: dict) -> None:
        self.loss.load_state_dict(state["loss"])
        for group in self.groups:
            # torch restores the saved param-group flags too: keep this run's implementation (fused; capturable under
            # CUDA graphs), so a checkpoint of an older run (foreach when compiled) or of a CUDA-graph run resumes
            kept = [{k: g[k] for k in IMPLEMENTATION_FLAGS if k in g} for g in group.optimizer.param_groups]
            group.optimizer.load_state_dict(state["optimizers"][group.name])
            for param_group, flags in zip(group.optimizer.param_groups, kept):
                param_group.update(flags)
        self.steps = int(state["steps"])
        if self.target_updater is not None:
            self.target_updater.updates = int(state["target_updates"])


def make_learner(cfg, parts, action_spec, *, sample_shape: tuple[int, ...], grad_sync=None, chunk: int = SAMPLE_CHUNK,
                 device: torch.device | None = None, overlap_sampling: bool = False,
                 compiled: bool | None = None) -> Learner:
    """The learner over an algorithm's parts (offpolicy/algos/): uniform replay is sampled ``chunk`` batches per call
    (prioritized and sliced replay one batch per call, as priorities change after every step); ``overlap_sampling``
    (uniform replay only) draws the next chunk while the current one is learned on; ``compiled``: whether its step
    runs under torch.compile (None: as the config chooses, :func:`~offpolicy.compiling.compile_choice`)."""
    compiled = compile_choice(cfg).enabled if compiled is None else compiled
    prioritized = cfg.replay.prioritized
    sampling = Sampling(sample_shape, chunk=1 if prioritized or cfg.replay.slice_len else chunk,
                        prioritized=prioritized, overlap=overlap_sampling and not prioritized)
    return Learner(parts, sampling, check_every=cfg.invariants.check_every, device=device,
                   action_bounds=parts.action_bounds(action_spec), grad_sync=grad_sync,
                   compile=CompileOptions(enabled=compiled, mode=cfg.compile.mode,
                                          skip_guards=cfg.compile.skip_guards, cudagraphs=cfg.compile.cudagraphs))
