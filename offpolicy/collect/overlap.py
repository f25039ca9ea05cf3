"""The run's collector in a child process, one batch ahead of the learner (``collector.overlap=true``, local engine):
the lean collector, or torchrl's Collector over the ALE vector env (Atari; the batches, frames included, come back
through shared memory and this process writes them into its replay, the frame replay too).

Why: at CleanRL's DQN setting (one CartPole env, one update per 10 env steps) collecting and learning each take about
half of a round in one process (docs/results.md, "Collection overlapped with learning"), so on two cores the
child collects round k+1 while this process learns on round k. The price is one round of policy lag: the
transitions of round k come from policy version k-1 (the weights published after round k-2), not k.

The hand-over is the same whatever the two processes' speeds, so a run stays reproducible: :meth:`__next__` waits for
the batch in flight, then copies the live collection policy (weights and exploration state) into a shared-memory
slot and orders the next batch with its version; the child copies the slot into its own policy before that batch,
and this process writes the slot again only once that batch is back.

A child that dies is noticed within a second; one that lives but sends nothing (a hung env, a deadlock) is stopped once
this process has waited ``collector.overlap_timeout_s`` for its batch. Either ends the run with :class:`CollectorLost`.
"""
from __future__ import annotations

import copy
import multiprocessing
import queue
import signal
import time
import traceback

import torch
import torch.multiprocessing as mp
from tensordict import TensorDict

from offpolicy import prepare_process
from shared.env_guard import EnvFault

POLL_S = 1.0  # how often a wait for a batch checks that the child is alive


class CollectorLost(RuntimeError):
    """The background collector process died, failed, or was stopped for sending nothing."""


def _collect(builder, policy, slot: TensorDict, seed: int, obs_norm: dict | None, orders, batches) -> None:
    """The child: the run's collector, made by the run's ``builder`` (offpolicy/builder.py), over its own copy of
    ``policy`` and its own training envs; per order (a policy version) the slot's weights into the policy and one
    batch back; ``None``, or the parent gone, ends it. A failure goes back as its traceback text."""
    prepare_process()  # a fresh interpreter (spawn)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into a stop, then ends this process
    torch.set_num_threads(1)
    torch.manual_seed(seed)  # the exploration's draws: the same run again collects the same batches
    batches.cancel_join_thread()  # exiting never waits for a batch the parent no longer reads
    from offpolicy.collect.lean import torchrl_env_copies

    try:
        env = builder.train_env(obs_norm, seed=seed, num_envs=torchrl_env_copies(builder.cfg))
        collector = builder.collector(env, policy, seed)
        rounds, parent = iter(collector), multiprocessing.parent_process()
        while True:
            try:
                version = orders.get(timeout=POLL_S)
            except queue.Empty:
                if parent is not None and not parent.is_alive():  # the run was killed: no orphan left behind
                    break
                continue
            if version is None:
                break
            slot.to_module(policy, inplace=True)
            collector.policy_version_tracker.version = version
            batches.put(next(rounds))
        collector.shutdown()
    except EnvFault as fault:  # the user's env failed: the parent ends the run with it as it is
        batches.put(fault)
    except Exception:  # noqa: BLE001 - any failure is reported to the parent, which ends the run with it
        batches.put(traceback.format_exc())


class BackgroundCollector:
    """The local engine's collector in a child process, one batch ahead; offers what the engine uses of a
    collector: iteration, ``update_policy_weights_()`` (one version more), ``policy_version``,
    ``policy_version_tracker.version`` (set on resume) and ``shutdown()``. ``seed`` seeds the env copies as the lean
    collector in this process would, and the child's torch draws; ``obs_norm``: the run's observation statistics;
    ``builder``: the run's (:class:`~offpolicy.builder.Builder`, sent to the child, which builds its env and collector
    with it). A batch this process has waited ``timeout_s`` (``collector.overlap_timeout_s``) for stops the child
    (the first wait includes the child's start)."""

    def __init__(self, builder, policy, seed: int, obs_norm: dict | None):
        ctx = mp.get_context("spawn")
        self.policy = policy
        self.slot = TensorDict.from_module(policy).data.clone().share_memory_()
        self.orders, self.batches = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=_collect, name="offpolicy-collector", daemon=True,
                                   # a copy: torch shares what it sends to a child, so the live weights would be
                                   # the child's too
                                   args=(builder, copy.deepcopy(policy), self.slot, seed, obs_norm, self.orders,
                                         self.batches))
        self.process.start()
        self.timeout_s = float(builder.cfg.collector.overlap_timeout_s)
        self.ordered_at = time.monotonic()  # when the batch in flight was ordered
        self.version = 0
        self.in_flight = False  # the first batch is ordered by the first __next__, after a resume has set weights
        self.policy_version_tracker = self

    def __iter__(self):
        return self

    def __next__(self) -> TensorDict:
        """The batch in flight (ordered now if none is); the next one is ordered before this returns."""
        if not self.in_flight:
            self._order()
        batch = self._receive()
        self._order()
        return batch

    def _order(self) -> None:
        self.slot.update_(TensorDict.from_module(self.policy).data)
        self.orders.put(self.version)
        self.ordered_at = time.monotonic()
        self.in_flight = True

    def _receive(self) -> TensorDict:
        # the child's silence counts from when this process starts waiting, not from the order: the child collects
        # while this process learns, and a long round of learning (or its compilation) is no silence of the child
        waiting_since = time.monotonic()
        while True:
            silent = time.monotonic() - waiting_since
            if silent >= self.timeout_s:
                raise self._stop_silent(silent) if self.process.is_alive() else self._died()
            try:
                item = self.batches.get(timeout=min(POLL_S, self.timeout_s - silent))
            except queue.Empty:
                if not self.process.is_alive():
                    raise self._died() from None
                continue
            except (OSError, EOFError):  # a batch whose sender died before it handed its shared memory over (the
                # fetch of its file descriptors finds the sender gone: refused, or the connection closed mid-reply)
                self.process.join(timeout=10 * POLL_S)
                if not self.process.is_alive():
                    raise self._died() from None
                raise
            if isinstance(item, EnvFault):
                self.in_flight = False
                raise item
            if isinstance(item, str):
                raise CollectorLost(f"the background collector failed: {item.strip().splitlines()[-1]}")
            self.in_flight = False
            return item

    def _died(self) -> CollectorLost:
        return CollectorLost(f"the background collector process died (exit code {self.process.exitcode})")

    def _stop_silent(self, silent: float) -> CollectorLost:
        """Ends a child that lives but sends nothing (a hung env, a deadlock; waiting on would hang the run),
        without waiting for it: nothing it holds is needed."""
        self.process.kill()
        self.process.join()
        return CollectorLost(f"the background collector process ({self.process.name}, pid {self.process.pid}) sent "
                             f"no batch in {silent:.1f} s of waiting for it (collector.overlap_timeout_s="
                             f"{self.timeout_s:g}); stopped it")

    @property
    def policy_version(self) -> int:
        return self.version

    def update_policy_weights_(self) -> None:
        """One version more; the weights travel with the next order (the slot holds the live policy then)."""
        self.version += 1

    def shutdown(self) -> None:
        if self.process.is_alive():
            self.orders.put(None)
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
