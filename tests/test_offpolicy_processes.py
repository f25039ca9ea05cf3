"""Process-wide settings are made where a process starts the off-policy engine's code (``offpolicy.prepare_process``),
never by importing it: tensordict's ``from_any`` fast path (shared/compat.py) is off in a fresh interpreter that
imported every entry module, and on in a training run and in the Ray actors' processes (a real collector actor:
tests/test_offpolicy_ray.py, the pool test)."""
from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from tensordict import TensorDictBase

from offpolicy.builder import Builder
from offpolicy.config import compose_config
from shared import compat

REPO = Path(__file__).resolve().parents[1]


def fast() -> bool:
    """Whether this process runs tensordict's ``from_any`` fast path."""
    return getattr(TensorDictBase.from_any.__func__, "rlstack_fast", False)


@pytest.fixture
def fresh_from_any(monkeypatch):
    """tensordict's own ``from_any``, as a fresh process has it (this test process's patch is restored afterwards)."""
    compat.fast_from_any()
    monkeypatch.setattr(TensorDictBase, "from_any", classmethod(TensorDictBase.from_any.__func__.tensordict_original))
    assert not fast()


def test_importing_the_engine_sets_nothing_process_wide():
    modules = ["offpolicy", "offpolicy.train", "offpolicy.api", "offpolicy.evaluate", "offpolicy.export",
               "offpolicy.engines.ray", "offpolicy.collect.overlap", "offpolicy.tools.plan"]
    code = (f"import importlib\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
            "from tensordict import TensorDictBase\n"
            "print(getattr(TensorDictBase.from_any.__func__, 'rlstack_fast', False))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "False"


def test_a_training_run_makes_the_settings_before_it_starts(tmp_path, monkeypatch, fresh_from_any):
    """From Python as from the command line (both go through ``offpolicy.train.train``): the settings hold when the
    run is made (here a recorder in place of the run)."""
    import offpolicy.train
    from offpolicy.api import train

    seen = []

    class Recorded:
        def __init__(self, cfg, checkpoint):
            seen.append(fast())

        def train(self, loop):
            return {"status": "completed"}

    monkeypatch.setattr(offpolicy.train, "Run", Recorded)
    assert train(algo="dqn", profile="smoke", run_dir=tmp_path) == {"status": "completed"}
    assert seen == [True]


def test_a_learner_rank_and_a_collector_actor_make_the_settings_in_their_process(fresh_from_any):
    """Each Ray actor class sets them up in its constructor, which runs in the actor's own process (here the classes
    in this process)."""
    from torchrl.data import LazyTensorStorage

    from offpolicy.engines.ray import LearnerRank, Specs
    from offpolicy.engines.ray_collectors import CollectorActor, ShareReplayBuffer

    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "engine=ray", "profile=smoke", "ray.world_size=1",
                             "ray.num_collectors=1", "env.obs_norm=false"])
    env = Builder(cfg).train_env(num_envs=1)
    threads = torch.get_num_threads()
    try:
        LearnerRank(OmegaConf.to_container(cfg), Specs(env), None, 0, 1, 0)
        assert fast()
        TensorDictBase.from_any = classmethod(TensorDictBase.from_any.__func__.tensordict_original)
        policy = copy.deepcopy(Builder(cfg).parts(env).collect_policy)
        actor = CollectorActor(dict(cfg), policy, ShareReplayBuffer(storage=LazyTensorStorage(10)), slot=0, seed=0,
                               obs_norm=None)
        actor.shutdown()
        assert fast()
    finally:
        env.close()
        torch.set_num_threads(threads)
