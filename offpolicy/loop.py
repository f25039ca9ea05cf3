"""The off-policy training loop, on one screen. Every engine (local, Ray) runs this same function; what differs is
where the engine's collector, replay and learner live (offpolicy/engines/)."""
from __future__ import annotations

import time

from offpolicy.algos.base import anneal
from offpolicy.report import RoundReport


def train_loop(run) -> None:
    """Collect, write, learn, publish, check, log, evaluate and checkpoint until ``total_env_steps`` transitions were
    collected or a stop was requested (Ctrl-C). ``run`` (offpolicy/run.py) holds the config, the engine, the
    algorithm's parts, the counters and the services around the loop: invariants, metrics, evaluator, checkpoints."""
    cfg, engine, parts, progress = run.cfg, run.engine, run.parts, run.progress
    while progress.env_steps < cfg.total_env_steps and not run.stop_requested:
        start = time.perf_counter()
        # 1. one batch from the stochastic collection policy, flattened into replay
        rollout = engine.collect()
        if parts.exploration is not None:
            anneal(parts.exploration, rollout.env_steps)  # anneal epsilon / noise by the env steps collected
        collected = time.perf_counter()
        # 2. UTD x env steps optimiser steps (each with its target update), once replay holds the prefill
        asked = run.steps_per_batch if engine.replay_size() >= cfg.collector.prefill_env_steps else 0
        learned, optim_steps = engine.update(asked, version=progress.batches, stop=lambda: run.stop_now)
        if run.stop_now:  # a second Ctrl-C ended the round's updates early: the round records what ran
            asked = optim_steps - progress.optim_steps
        # 3. the collectors act with the new weights (and exploration state) from the next round on
        published = engine.publish()
        report = RoundReport(index=progress.batches, rollout=rollout, replay_writes=engine.replay_writes(),
                             replay_size=engine.replay_size(), steps_asked=asked,
                             steps_done=optim_steps - progress.optim_steps, learned=learned, published=published,
                             collect_s=collected - start, learn_s=time.perf_counter() - collected)
        # 4. invariants (finite losses and returns too), counters, metrics
        run.invariants.check(report)
        progress.advance(report)
        run.metrics.log(report, progress)
        # 5. evaluation in the background, periodic checkpoint
        run.evaluate_if_due()
        run.checkpoint_if_due()
