"""One test per entry of shared/compat.py (the private attributes of our dependencies that we still touch), so an
upgrade that breaks one fails here, under its name."""
from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from shared import compat


def test_fast_from_any_returns_plain_tensors_and_still_converts_the_rest():
    compat.fast_from_any()
    compat.fast_from_any()  # idempotent
    t = torch.zeros(3)
    assert TensorDict.from_any(t) is t
    converted = TensorDict.from_any({"a": torch.ones(2)})  # not a tensor: tensordict's own conversion
    assert isinstance(converted, TensorDictBase) and torch.equal(converted["a"], torch.ones(2))


def _memmap_buffer(path):
    from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

    return TensorDictReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=str(path), existsok=True))


def test_memmap_replay_state_leaves_out_the_data_and_reopens_the_files(tmp_path):
    replay = _memmap_buffer(tmp_path)
    data = TensorDict({"x": torch.arange(10.0).unsqueeze(-1)}, batch_size=[10])
    replay.extend(data)
    state = compat.replay_state_without_data(replay.state_dict())
    assert compat.STORAGE_KEY not in state[compat.STORAGE_KEY]  # no copy of the transitions in the checkpoint
    reopened = _memmap_buffer(tmp_path)
    compat.reopen_memmap_replay(reopened, tmp_path, state)
    assert len(reopened) == 10 and reopened.write_count == 10
    assert torch.equal(reopened.storage.get(torch.arange(10))["x"], data["x"])


def test_prioritized_sampler_builds_our_trees_and_checkpoints_them_as_tensors():
    from offpolicy.prioritized import TorchPrioritizedSampler, TorchSegmentTree

    sampler = TorchPrioritizedSampler(8, alpha=1.0, beta=1.0)
    sum_tree, min_tree = sampler.trees()
    assert isinstance(sum_tree, TorchSegmentTree) and isinstance(min_tree, TorchSegmentTree)
    sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    state = sampler.state_dict()
    assert all(isinstance(state[k], torch.Tensor) for k in compat.PrioritizedTreesHook.TREES)
    restored = TorchPrioritizedSampler(8, alpha=1.0, beta=1.0)
    restored.load_state_dict(state)
    assert torch.equal(restored.trees()[0].values, sum_tree.values)
    assert restored.trees()[1].values[:4].tolist() == min_tree.values[:4].tolist()


def test_gym_env_of_reaches_the_gymnasium_env():
    import gymnasium

    from shared.envs import make_env

    env = make_env("Pendulum-v1", render=True)
    try:
        assert isinstance(compat.gym_env_of(env), gymnasium.Env)
    finally:
        env.close()


def test_mujoco_context_is_made_current_before_rendering():
    os.environ.setdefault("MUJOCO_GL", "egl")
    from shared.envs import make_env
    from shared.rendering import render_frame

    env = make_env("Hopper-v5", render=True)
    try:
        env.reset()
        compat.make_mujoco_context_current(compat.gym_env_of(env))
        frame = render_frame(env)
        assert frame.ndim == 3 and frame.shape[-1] == 3 and frame.std() > 0  # a real picture, not a black frame
    finally:
        env.close()


def test_ray_single_machine_mode(monkeypatch):
    pytest.importorskip("ray")
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    monkeypatch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "1")
    compat.ray_single_machine_mode()
    assert os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] == "0"
    assert ray_constants.ENABLE_RAY_CLUSTER is False
