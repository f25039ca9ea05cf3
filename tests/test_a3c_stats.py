"""The shared run statistics: a reader sees an episode count only together with that episode's row (a lock per row
orders the stores on any CPU), and a lock left held by a killed worker does not freeze the run."""
from __future__ import annotations

import threading
import time

from a3c import stats as stats_module
from a3c.stats import SharedStats


def test_a_writer_publishes_its_row_only_under_the_row_lock():
    stats = SharedStats(workers=2, episode_capacity=8)
    stats.add_episode(0, score=3.0, length=100)
    done = threading.Event()
    with stats.locks[1]:  # a reader (this test) holds worker 1's row
        writer = threading.Thread(target=lambda: (stats.add_episode(1, score=5.0, length=7), done.set()))
        writer.start()
        time.sleep(0.2)
        assert not done.is_set()  # the writer waits: no count without its row
    writer.join(timeout=5)
    assert done.is_set()
    rows = stats.episodes_since([0, 0])
    assert [(rank, score, length) for rank, score, length, _ in rows] == [(0, 3.0, 100.0), (1, 5.0, 7.0)]
    assert stats.snapshot()["episodes"] == 2 and stats.episode_counts() == [1, 1]


def test_a_lock_held_by_a_dead_worker_only_delays_readers(monkeypatch):
    monkeypatch.setattr(stats_module, "LOCK_TIMEOUT_S", 0.1)
    stats = SharedStats(workers=1)
    stats.add_progress(0, frames=40, updates=1)
    stats.locks[0].acquire()  # as if its worker died inside add_progress
    start = time.monotonic()
    assert stats.frames == 40 and stats.snapshot()["updates"] == 1  # read without the lock, after the timeout
    stats.add_progress(0, frames=40, updates=1)  # the restarted worker goes on too
    assert stats.frames == 80 and time.monotonic() - start < 2


def test_training_at_the_end_of_the_evaluated_weights_interval_is_behind():
    stats = SharedStats(workers=1)
    stats.add_progress(0, frames=1000, updates=1)
    assert not stats.eval_behind(500)  # nothing being evaluated
    stats.start_eval(1000)
    stats.add_progress(0, frames=499, updates=1)
    assert not stats.eval_behind(500)
    stats.add_progress(0, frames=1, updates=1)
    assert stats.eval_behind(500)
    stats.add_eval(1000, mean=-20.0, std=1.0, episodes=3)
    assert not stats.eval_behind(500)
    assert stats.evals_since(0) == ([(1000.0, -20.0, 1.0, 3.0, 1500.0)], 1)  # its weights' frames, then the result's
    stats.add_progress(0, frames=200, updates=1)
    stats.start_eval(1700)  # weights inside an interval (1500-2000): the workers wait at its end, 2000
    stats.add_progress(0, frames=299, updates=1)
    assert not stats.eval_behind(500)
    stats.add_progress(0, frames=1, updates=1)
    assert stats.eval_behind(500)
    stats.end_eval()  # a stopped or dead evaluator: nobody waits
    assert not stats.eval_behind(500)
    stats.add_eval_wait(0, 1.25)
    assert stats.eval_wait_s() == [1.25] and stats.snapshot()["frames"] == 2000


def _poll_forever(flag) -> None:
    while True:
        flag.is_set()
        flag.wait(0.001)


def test_a_child_killed_while_polling_the_stop_flag_cannot_block_the_run():
    """The stop flag has no lock a SIGKILLed child could leave held (a multiprocessing.Event has: a killed evaluator
    once froze a run's stop, its workers and its replacement evaluator for good)."""
    import multiprocessing as mp
    import os
    import signal

    from a3c.child_process import StopFlag

    ctx = mp.get_context("spawn")
    flag = StopFlag(ctx)
    for _ in range(3):
        child = ctx.Process(target=_poll_forever, args=(flag,), daemon=True)
        child.start()
        time.sleep(0.5)
        os.kill(child.pid, signal.SIGKILL)
        child.join(5)
    start = time.monotonic()
    assert flag.wait(0.05) is False and not flag.is_set()
    flag.set()
    assert flag.is_set() and flag.wait(10) is True and time.monotonic() - start < 1
