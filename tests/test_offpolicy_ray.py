"""The Ray engine (engine=ray): smoke runs per family with every invariant, killed collectors (replaced, or past the
limit the end of the run), resources that
cannot be had, config errors, and the per-round invariants on their own. Every run that starts Ray must leave no Ray
process behind."""
from __future__ import annotations

import copy
import math
import os
import signal
import time
from types import SimpleNamespace

import psutil
import pytest
import torch
from offpolicy_helpers import run_cli, summary
from proc import ray_processes, start_module, wait_no_ray

from offpolicy.builder import Builder
from offpolicy.collect.statistics import Rollout
from offpolicy.config import compose_config
from offpolicy.invariants import InvariantError
from shared.checkpoint import load_checkpoint
from shared.config import ConfigError
from shared.logging import read_scalars

def test_ray_smoke_sac(tmp_path):
    """profile=ray_smoke: 2 collector actors, 2 Gloo learner ranks, 5 rounds of 400 transitions (2 of prefill), with
    3-step returns written by the replay actor."""
    result = run_cli("algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "loss.n_steps=3", f"run_dir={tmp_path}",
                     timeout=280)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Ray: 2 collector actors x 1 envs, 2 gloo learner ranks x 32 samples" in result.stdout
    s = summary(tmp_path)
    assert s["engine"] == "ray" and s["status"] == "completed" and s["error"] is None
    # transitions written == collected (summed over both actors); 4 optimising rounds x 50 steps; one weight
    # publication per round
    assert s["env_steps"] == 2000 and s["replay_writes"] == 2000 and s["batches"] == 5
    assert s["optim_steps"] == 200 and s["policy_version"] == 5
    assert s["episodes"] > 0 and math.isfinite(s["train_return_last"]) and math.isfinite(s["eval_return_last"])
    ckpt = load_checkpoint(tmp_path / "checkpoints" / "last.pt")
    # the learner's state, taken once every rank's networks were checked equal (gradient averaging keeps them so)
    assert ckpt["learner"]["steps"] == 200 and set(ckpt["learner"]["optimizers"]) == {"actor", "critic", "alpha"}
    assert any((tmp_path / "logs" / "scalars" / "loss").glob("*.csv")), "no loss/ metrics logged"
    _, windows = read_scalars(tmp_path, "replay/steps_to_next_obs")  # Pendulum never ends early: 3 but at batch ends
    assert windows and all(2.5 < k <= 3 for k in windows), windows
    assert not wait_no_ray(), "Ray processes left behind"


def _wait_for_training(proc, run_dir, log, timeout=180.0) -> None:
    """Until the learner has trained a round (loss metrics exist): the steady state."""
    deadline = time.monotonic() + timeout
    losses = run_dir / "logs" / "scalars" / "loss"
    while time.monotonic() < deadline and not (losses.is_dir() and any(losses.iterdir())):
        assert proc.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)  # a directory listing: polling often costs nothing, and the test acts as soon as it trains
    assert losses.is_dir(), "the run never trained: " + log.read_text()[-2000:]


def test_ray_ctrl_c_saves_and_leaves_no_ray_process(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it): the run finishes its round, saves the
    learner's state, writes the summary, exits 130 and leaves no Ray process. One learner rank: what an interrupt
    does is the same for any number of ranks (the state of two ranks, checked equal, is the smoke run's checkpoint
    above), and each rank is one more process to start on a 2-core machine."""
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    proc = start_module("offpolicy.train", "algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "ray.world_size=1",
                        "total_env_steps=100000", "eval.interval_env_steps=0", f"run_dir={run_dir}", log=log)
    try:
        _wait_for_training(proc, run_dir, log)
        os.killpg(proc.pid, signal.SIGINT)
        code = proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert code == 130, log.read_text()[-3000:]
    s = summary(run_dir)
    assert s["status"] == "interrupted" and s["env_steps"] % 400 == 0 and s["optim_steps"] > 0
    ckpt = load_checkpoint(run_dir / "checkpoints" / "last.pt")
    assert ckpt["learner"]["steps"] == s["optim_steps"] and s["policy_version"] == s["batches"] == s["env_steps"] // 400
    assert ckpt["counters"]["env_steps"] == s["env_steps"]
    assert not wait_no_ray(), "Ray processes left behind after Ctrl-C"


def _collector_actors(proc, timeout: float = 30.0) -> list[psutil.Process]:
    """The run's collector actor processes (a replacement takes a moment to start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name().startswith("ray::Collector")]
        if found:
            return found
        time.sleep(0.1)
    return []


def test_a_dead_collector_past_the_limit_ends_the_run_and_it_resumes(tmp_path):
    """DQN on CartPole with profile=ray_smoke and ray.max_collector_restarts=0: SIGKILL a collector actor once the
    run trains. Whatever it was doing (a batch, a replay write, a weight publication), no replacement is left: the
    run ends within 30 s with one error line naming the limit, exit 4, a summary and a checkpoint whose learner
    matches its counters, and no Ray process left. Resuming it restores the rank and completes exactly. (Which
    moment a death comes at, and a replacement's accounting, are tested with fixed paths: the fake-actor tests below
    and the real-Ray pool test.) One learner rank, as in the Ctrl-C test above: a death is the collectors' matter, and
    the state of two ranks, checked equal, is the smoke run's checkpoint."""
    run_dir, log = tmp_path / "run", tmp_path / "log.txt"
    proc = start_module("offpolicy.train", "algo=dqn", "env=CartPole-v1", "profile=ray_smoke", "ray.world_size=1",
                        "total_env_steps=100000",
                        "eval.interval_env_steps=0", "ray.max_collector_restarts=0", f"run_dir={run_dir}", log=log)
    try:
        _wait_for_training(proc, run_dir, log)
        actors = _collector_actors(proc)
        assert actors and proc.poll() is None, log.read_text()[-3000:]
        actors[0].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        code = proc.wait(timeout=60)
        assert time.monotonic() - killed < 30
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert code == 4, out[-3000:]
    assert "ray: collector" not in out and "error: a Ray collector died (CollectorActor, pid" in out
    failed = summary(run_dir)
    assert failed["status"] == "failed" and failed["collector_restarts"] == 0
    assert "no replacement left (ray.max_collector_restarts=0)" in failed["error"]
    # every counted round was whole: as many transitions written as counted, one publication per round
    assert failed["replay_writes"] == failed["env_steps"] == 400 * failed["batches"]
    assert failed["policy_version"] == failed["batches"]
    ckpt = load_checkpoint(failed["checkpoint"])
    assert ckpt["counters"]["env_steps"] == failed["env_steps"]
    assert ckpt["learner"]["steps"] == failed["optim_steps"] > 0
    # the hard target copies' phase (DQN: every 128 updates) is in the learner's state, so a resume keeps it
    assert ckpt["learner"]["target_updates"] == failed["optim_steps"]
    assert not wait_no_ray()

    target = failed["env_steps"] + 800
    resumed = run_cli(f"resume={failed['checkpoint']}", f"total_env_steps={target}", timeout=280)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    s = summary(run_dir)
    # the replay actor starts empty and is prefilled again (800 transitions): only the second new round optimises
    assert s["status"] == "completed" and s["env_steps"] == target and s["replay_writes"] == 800
    assert s["optim_steps"] == failed["optim_steps"] + 50 and s["policy_version"] == failed["policy_version"] + 2
    assert s["episodes"] > failed["episodes"] and math.isfinite(s["eval_return_last"])
    learner = load_checkpoint(run_dir / "checkpoints" / "last.pt")["learner"]
    assert learner["steps"] == learner["target_updates"] == s["optim_steps"]
    assert not wait_no_ray()


def test_unavailable_resources_fail_fast(tmp_path):
    """More CPUs than the cluster has: one error line and exit 2 within seconds, instead of actors waiting forever."""
    start = time.monotonic()
    result = run_cli("algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "ray.num_cpus=2", "ray.num_collectors=4",
                     "ray.collector_cpus=1", f"run_dir={tmp_path}", timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: ray: the job needs 5 CPU (cluster has 2); allowed: fewer ray.num_collectors / ray.world_size, "
        "smaller ray.collector_cpus / learner_cpus / *_gpus, or a bigger cluster")
    assert time.monotonic() - start < 60
    assert not wait_no_ray()


@pytest.mark.parametrize("override,message", [
    ("replay.prioritized=true", "replay.prioritized=True is not allowed with engine=ray"),
    ("optim.batch_size=63", "optim.batch_size=63 is not allowed; allowed: a multiple of ray.world_size=2"),
    ("ray.num_collectors=3", "collector.env_steps_per_batch=400 is not allowed; allowed: a multiple of "
                             "ray.num_collectors * env.num_envs = 3"),
    ("ray.backend=nccl", "ray.learner_gpus=0.0 is not allowed with ray.backend=nccl"),
    ("ray.backend=mpi", "ray.backend='mpi' is not allowed; allowed: one of gloo, nccl"),
])
def test_ray_config_errors(override, message):
    """Checked while composing, before Ray starts (the CLI prints them as one ``error:`` line, exit 2)."""
    with pytest.raises(ConfigError) as info:
        compose_config(["algo=sac", "env=Pendulum-v1", "profile=ray_smoke", override])
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_ray_nccl_learner(tmp_path):
    """NCCL learner ranks, one GPU each (as many ranks as GPUs, at most 2)."""
    ranks = min(torch.cuda.device_count(), 2)
    result = run_cli("algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "ray.backend=nccl", "ray.learner_gpus=1",
                     f"ray.world_size={ranks}", f"run_dir={tmp_path}", timeout=280)
    assert result.returncode == 0, result.stderr[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "completed" and s["optim_steps"] == 200 and s["policy_version"] == 5
    assert not wait_no_ray()


# --- the learner ranks' agreement, without Ray ----------------------------------------------------------------------

class _Rank:
    """A fake learner rank whose remote calls return at once."""

    def __init__(self, weight):
        self.state = {"loss": {"w": torch.tensor([weight])}, "steps": 7}
        self.state_dict = SimpleNamespace(remote=lambda: self.state)


def _engine_with_ranks(monkeypatch, weights):
    from offpolicy.engines.ray import RayEngine

    monkeypatch.setattr(RayEngine, "_get", staticmethod(lambda refs, timeout: refs))
    engine = object.__new__(RayEngine)
    engine.ranks, engine.timeout = [_Rank(w) for w in weights], 1.0
    return engine


def test_checkpoint_takes_rank_0_state_when_ranks_agree(monkeypatch):
    engine = _engine_with_ranks(monkeypatch, [1.0, 1.0])
    assert engine.learner_state() is engine.ranks[0].state


def test_diverged_ranks_break_an_invariant(monkeypatch):
    engine = _engine_with_ranks(monkeypatch, [1.0, 1.5])
    with pytest.raises(InvariantError, match="learner rank 1's networks differ from rank 0's"):
        engine.learner_state()


def test_learner_ranks_draw_from_the_runs_seed():
    """A rank's samples and noise come from the run's seed (a resumed run passes a new one) and its rank: the same
    seed repeats, a resumed run's seed or another rank draws anew (ranks used to reseed with seed + 1 + rank on
    every resume)."""
    from omegaconf import OmegaConf

    from offpolicy.engines.ray import LearnerRank, Specs
    from offpolicy.envs import make_train_env

    cfg, _ = compose_config(["algo=dqn", "profile=smoke"])
    env = make_train_env(cfg)
    threads = torch.get_num_threads()

    def draws(seed, rank):
        LearnerRank(OmegaConf.to_container(cfg), Specs(env), None, rank, 2, seed)
        return torch.rand(4)

    try:
        assert torch.equal(draws(5, 0), draws(5, 0))
        assert not torch.equal(draws(5, 0), draws(6, 0))
        assert not torch.equal(draws(5, 0), draws(5, 1))
    finally:
        torch.set_num_threads(threads)


def test_a_ray_failure_wrapped_in_another_error_is_still_one_line():
    """torchrl's collectors may raise their own error from Ray's: it is still named as a Ray failure (one line, exit
    4), not a traceback; an error with no Ray error behind it is not."""
    import ray.exceptions

    from offpolicy.engines.ray import describe_ray_failure

    try:
        try:
            raise ray.exceptions.GetTimeoutError("collector.next timed out")
        except ray.exceptions.GetTimeoutError as inner:
            raise RuntimeError("collection failed") from inner
    except RuntimeError as exc:
        assert describe_ray_failure(exc) == "a Ray actor did not answer in time (collector.next timed out)"
    assert describe_ray_failure(ValueError("not Ray")) is None


def test_collector_pool_resumes_at_any_version_in_one_call(tmp_path, capsys):
    """A resumed run's collector actors join at the checkpoint's policy version in one call per actor (not one
    publication per past round), carry it into their next batch, and a publication sends the driver's weights. An
    actor killed between rounds (so it dies before its write) is replaced on a fresh seed slot at the current version
    and its replacement collects the share: the round is whole. An actor that dies in a publication with no
    replacement left ends the run at the next collection."""
    import ray
    from tensordict import TensorDict, TensorDictBase

    from offpolicy.engines.ray import make_replay_actor, start_ray
    from offpolicy.engines.ray import describe_ray_failure
    from offpolicy.engines.ray_collectors import CollectorPool, CollectorsExhausted
    from offpolicy.envs import make_train_env

    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=ray_smoke", "ray.world_size=1",
                             f"run_dir={tmp_path}"])
    env = make_train_env(cfg, None, seed=0, num_envs=1)
    parts = Builder(cfg).parts(env)
    start_ray(cfg)
    pool = None
    try:
        replay = make_replay_actor(cfg)
        pool = CollectorPool(cfg, parts.collect_policy, replay, None, seed=0)
        weights = TensorDict.from_module(parts.collect_policy).data
        assert pool.call("policy_version") == [0, 0]  # the actors are up: their start-up is not timed below
        # each actor's process made the engine's process-wide settings as it started (offpolicy.prepare_process)
        fast = [a.__ray_call__.remote(lambda _: getattr(TensorDictBase.from_any.__func__, "rlstack_fast", False))
                for a in pool.actors]
        assert ray.get(fast) == [True, True]
        # the leftover check sees this session's cluster (else every `not wait_no_ray()` would hold vacuously)
        assert {"raylet", "gcs_server", "ray::CollectorActor"} <= set(ray_processes())
        start = time.monotonic()
        pool.restore(weights, version=1_000_000)
        assert time.monotonic() - start < 10
        assert pool.call("policy_version") == [1_000_000, 1_000_000]
        rollout = pool.round()
        assert rollout.env_steps == 400 == len(replay) and (rollout.version_lo, rollout.version_hi) == (1_000_000,) * 2
        ray.kill(pool.actors[0])
        rollout = pool.round()
        replaced = "ray: collector 0 died; replaced by a new actor on env seed slot 2 (restart 1 of 3)"
        assert replaced in capsys.readouterr().out
        assert rollout.env_steps == 400 and replay.write_count == 800 and len(rollout.returns) > 0
        assert (rollout.version_lo, rollout.version_hi) == (1_000_000,) * 2 and pool.slots == [2, 1]
        with torch.no_grad():
            for p in parts.collect_policy.parameters():
                p.fill_(0.25)
        assert pool.publish(TensorDict.from_module(parts.collect_policy).data) == 1_000_001
        local = parts.collect_policy.state_dict()  # the Q network at 0.25, epsilon's buffers as they were
        for state in pool.call("policy_state"):
            assert state.keys() == local.keys() and all(torch.equal(state[k], local[k]) for k in local)
        assert pool.restarts == 1
        # a death past the limit during a publication (after the round's learning): the publication completes for
        # the live actors and the run ends at the next collection, so the loop has counted the round first
        pool.max_restarts = 1
        ray.kill(pool.actors[0])
        assert pool.publish(TensorDict.from_module(parts.collect_policy).data) == 1_000_002
        with pytest.raises(CollectorsExhausted) as info:
            pool.round()
        line = describe_ray_failure(info.value)
        assert line.startswith("a Ray collector died (") and line.endswith(
            "; no replacement left (ray.max_collector_restarts=1)"), line
    finally:
        if pool is not None:
            pool.close()
        env.close()
        ray.shutdown()
    assert not wait_no_ray()


def test_a_collector_actor_runs_the_lean_collector_on_its_own_seed_slot():
    """A Ray collector actor (here its class in this process, with a local replay buffer in place of the replay
    actor) runs the lean collector on a Gymnasium state-vector env, on its slot's seeds (collector 1 of a DQN run with
    2 envs per collector plays seeds 2 and 3), from one torchrl env copy read for its specs (not one per env): it
    writes its share of a round into replay, tagged with its slot, reports it at policy version 0, a publication
    copies the weights into its policy and counts one version, and once its slot is closed (the pool replaced it) its
    writes are refused and not counted."""
    import gymnasium as gym
    from tensordict import TensorDict

    from offpolicy.collect.lean import LeanCollector
    from torchrl.data import LazyTensorStorage

    from offpolicy.engines.ray_collectors import CollectorActor, ShareReplayBuffer

    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "engine=ray", "env.num_envs=2", "ray.num_collectors=2",
                             "collector.env_steps_per_batch=40", "env.obs_norm=false"])
    specs = Builder(cfg).train_env(num_envs=1)
    parts = Builder(cfg).parts(specs)
    specs.close()
    replay = ShareReplayBuffer(storage=LazyTensorStorage(100))
    # the actor holds its own copy of the policy, as one unpickled in its process does
    actor = CollectorActor(dict(cfg), copy.deepcopy(parts.collect_policy), replay, slot=1, seed=0, obs_norm=None)
    try:
        assert isinstance(actor.collector, LeanCollector) and len(actor.collector.envs) == 2
        assert actor.collector.spec_env.batch_size == torch.Size([])  # one torchrl copy, unbatched
        expected = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2).reset(seed=[2, 3])[0]
        first = torch.from_numpy(actor.collector.observation).clone()  # the observations it acts on next
        assert torch.allclose(first, torch.as_tensor(expected, dtype=torch.float32))
        actor.collect(1)
        assert len(replay) == 20 and replay.close_writer(0) is None  # its share (40 / 2 collectors), slot 1's
        rollout = actor.drain()
        assert rollout.env_steps == 20 and (rollout.version_lo, rollout.version_hi) == (0, 0)
        assert torch.equal(replay[:].get("observation")[0], first[0])
        with torch.no_grad():
            for p in parts.collect_policy.parameters():
                p.fill_(0.5)
        weights = [k for k in parts.collect_policy.state_dict() if k.endswith("weight")]
        assert not any(torch.equal(actor.policy_state()[k], parts.collect_policy.state_dict()[k]) for k in weights)
        assert actor.publish(TensorDict.from_module(parts.collect_policy).data) == 1
        assert all(torch.equal(v, parts.collect_policy.state_dict()[k]) for k, v in actor.policy_state().items())
        actor.set_version(7)
        actor.collect(2)
        assert (actor.drain().version_lo, actor.policy_version()) == (7, 7)
        assert replay.close_writer(1) == 2
        actor.collect(3)
        assert len(replay) == 40 and actor.drain().env_steps == 0
    finally:
        actor.shutdown()


# --- the collector pool's accounting after deaths, with fake actors (no Ray) ----------------------------------------

class _Died(Exception):
    """A fake actor's death (Ray's RayActorError in a real pool)."""


class _FakeCollector:
    """A collector actor in this process on seed slot ``slot`` that writes ``share`` transitions per round into
    ``replay`` (a :class:`ShareReplayBuffer`) and dies where ``death`` says: "start-up" (setting its version),
    "before-write", "after-write", "late-write" (its write still on its way when its death is seen: it lands in
    replay when its replacement collects, after the pool has decided about the share) or "drain" (before its
    statistics are read) or "publish" (in a weight publication). Its statistics are one episode whose return is its
    slot. ``actor.method.remote(*args)``
    returns the call, run when the pool gathers it."""

    def __init__(self, slot, replay, share, death, pending):
        self.slot, self.replay, self.share, self.death, self.pending = slot, replay, share, death, pending
        self.collected = 0
        self.version = None
        for name in ("collect", "drain", "set_version", "publish", "policy_version"):
            setattr(self, name, SimpleNamespace(remote=lambda *args, name=name: lambda: self._call(name, *args)))

    def _call(self, name, *args):
        assert self.death != "killed", f"the pool called {name} on a killed actor"
        return getattr(self, "_" + name)(*args)

    def _write(self, round_index):
        from tensordict import TensorDict

        batch = TensorDict({"observation": torch.full((self.share, 1), float(self.slot))}, [self.share])
        if self.replay.write_share(batch, self.slot, round_index):
            self.collected += self.share

    def _collect(self, round_index):
        while self.pending and self.slot >= 2:  # a replacement collects: the dead actor's late write lands
            self.pending.pop()()
        if self.death == "before-write":
            raise _Died
        if self.death == "late-write":
            self.pending.append(lambda: self._write(round_index))
            raise _Died
        self._write(round_index)
        if self.death == "after-write":
            raise _Died

    def _drain(self):
        if self.death == "drain":
            raise _Died
        collected, self.collected = self.collected, 0
        return Rollout(env_steps=collected, returns=[float(self.slot)] if collected else [],
                       version_lo=self.version, version_hi=self.version)

    def _set_version(self, version):
        if self.death == "start-up":
            raise _Died
        self.version = version

    def _publish(self, weights):
        if self.death == "publish":
            raise _Died
        self.version += 1
        return self.version

    def _policy_version(self):
        return self.version


def _fake_pool(deaths: dict[int, str]):
    """A :class:`CollectorPool` of 2 fake collectors (shares of 200) over a local :class:`ShareReplayBuffer`; the
    actor on seed slot ``s`` dies as ``deaths[s]`` says (actor 0's replacements take slots 2, 4, ...)."""
    from torchrl.data import LazyTensorStorage

    from offpolicy.engines.ray_collectors import CollectorPool, ShareReplayBuffer

    replay = ShareReplayBuffer(storage=LazyTensorStorage(10_000))
    replay.client = lambda: replay  # the pool's and the actors' way in (a RayReplayBuffer's client in a run)
    pending = []

    class FakePool(CollectorPool):
        def _start(self, slot):
            return _FakeCollector(slot, replay, self.share, deaths.get(slot), pending)

        def _gather(self, refs):
            results, dead = [], []
            for i, call in enumerate(refs):
                try:
                    results.append(call())
                except _Died as exc:
                    results.append(exc)
                    dead.append(i)
            return results, dead

        def _kill(self, actor):
            actor.death = "killed"  # a killed fake answers nothing more: any call would be a pool error

    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=ray_smoke", "ray.max_collector_restarts=3"])
    pool = FakePool(cfg, None, replay, None, seed=0)
    pool.version = 5  # what every actor holds after 5 publications
    return pool, replay


@pytest.mark.parametrize("deaths,restarts,kept", [
    # actor 0 dies before its write: its replacement (slot 2) collects the share again
    ({0: "before-write"}, 1, [1.0, 2.0]),
    # after its write: the share stays in replay, its statistics are lost, nothing is collected again
    ({0: "after-write"}, 1, [1.0]),
    # after collecting, while the statistics are read: the share is counted without its statistics
    ({0: "drain"}, 1, [1.0]),
    # after its write, then its replacement dies before collecting, while the statistics are read: one share lost
    # (not two: the replacement held none)
    ({0: "after-write", 2: "drain"}, 2, [1.0]),
    # before its write, its replacement while it starts, the next one before its write: the third collects
    ({0: "before-write", 2: "start-up", 4: "before-write"}, 3, [1.0, 6.0]),
    # its write still on its way when its death is seen, and landing afterwards: refused, the replacement's counts
    ({0: "late-write"}, 1, [1.0, 2.0]),
])
def test_collector_deaths_keep_every_round_exact(deaths, restarts, kept, capsys):
    """Whichever moment a collector dies at, a round counts exactly the transitions that reached replay (the
    per-round invariant: written == collected, 400) and loses only the statistics of shares that reached replay
    without them (``kept``: the slots whose statistics arrived); the next round is whole again."""
    pool, replay = _fake_pool(deaths)
    rollout = pool.round()
    assert replay.write_count == rollout.env_steps == 400
    assert sorted(rollout.returns) == kept  # shares lost: 2 - len(kept), counted at version 5
    assert (rollout.version_lo, rollout.version_hi) == (5, 5)
    assert pool.restarts == restarts and capsys.readouterr().out.count("ray: collector 0 died") == restarts
    rollout = pool.round()
    assert replay.write_count == 800 and rollout.env_steps == 400 and len(rollout.returns) == 2


def test_a_collector_dying_before_its_write_in_a_later_round_is_collected_again():
    """The replay knows which round each slot wrote last: an actor that wrote round 1 and dies before its write of
    round 2 has its round-2 share collected by its replacement (slot 3), not taken for written."""
    pool, replay = _fake_pool({})
    pool.round()
    pool.actors[1].death = "before-write"
    rollout = pool.round()
    assert replay.write_count == 800 and rollout.env_steps == 400 and sorted(rollout.returns) == [0.0, 3.0]
    assert pool.restarts == 1 and pool.slots == [0, 3]


def test_a_collector_dying_in_a_publication_is_replaced_at_the_published_version(monkeypatch):
    """An actor that dies while weights are published: its replacement starts with the driver's policy at the new
    version and does not publish again, so every actor holds exactly one version more, and the next round carries it.
    (A replacement that also answered the publication would hold one version too many; the lowest version, which is
    all the publication returns, hid it.)"""
    import ray

    monkeypatch.setattr(ray, "put", lambda weights: weights)  # no object store: the fakes take the weights as they are
    pool, replay = _fake_pool({0: "publish"})
    for actor in pool.actors:
        actor.version = 5
    assert pool.publish(weights=None) == 6
    assert pool.restarts == 1 and pool.slots == [2, 1]
    assert pool.call("policy_version") == [6, 6]
    rollout = pool.round()
    assert (rollout.version_lo, rollout.version_hi) == (6, 6) and replay.write_count == rollout.env_steps == 400
