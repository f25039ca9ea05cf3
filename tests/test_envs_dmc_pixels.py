"""dm_control tasks (``dmc:<domain>-<task>``), pixel observations for MuJoCo tasks, and the pixel encoder."""
import os

os.environ.setdefault("MUJOCO_GL", "egl")  # offscreen MuJoCo rendering, before any GL context is made

import sys

import pytest
import torch

from shared.config import ConfigError
from shared.envs import check_gym_name, make_env
from shared.models import PixelEncoder


def test_dmc_task_rollout_concatenates_observations():
    pytest.importorskip("dm_control")
    from dm_control import suite

    env = make_env("dmc:cartpole-swingup", seed=3)  # first: it makes dm_control work with the installed MuJoCo
    expected = sum(torch.Size(s.shape).numel() for s in suite.load("cartpole", "swingup").observation_spec().values())
    td = env.rollout(5)
    assert td["observation"].shape == (5, expected) and td["observation"].dtype == torch.float32
    assert td["next", "reward"].shape == (5, 1) and td["next", "reward"].dtype == torch.float32
    assert td["next", "episode_reward"][-1].item() == pytest.approx(td["next", "reward"].sum().item(), rel=1e-5)
    again = make_env("dmc:cartpole-swingup", seed=3).reset()
    assert torch.equal(td["observation"][0], again["observation"])  # seeded (the actions were random)


def test_dmc_names_are_checked():
    pytest.importorskip("dm_control")
    check_gym_name("dmc:ball_in_cup-catch")  # underscores in the domain
    check_gym_name("dmc:walker-walk")
    with pytest.raises(ConfigError, match="dmc:cartpole-swingup"):
        check_gym_name("dmc:cartpole-jump")  # lists the domain's tasks
    with pytest.raises(ConfigError, match="cheetah"):
        check_gym_name("dmc:spaceship-fly")  # lists the domains


def test_missing_dm_control_is_a_one_line_error_naming_the_extra(monkeypatch):
    for module in [m for m in sys.modules if m == "dm_control" or m.startswith("dm_control.")]:
        monkeypatch.delitem(sys.modules, module)
    monkeypatch.setitem(sys.modules, "dm_control", None)  # `import dm_control` raises ImportError
    with pytest.raises(ConfigError) as err:
        make_env("dmc:cheetah-run")
    message = str(err.value)
    assert "\n" not in message and "env.name='dmc:cheetah-run'" in message and "pip install -e '.[dmc]'" in message


def test_mujoco_pixels_are_uint8_channels_first():
    env = make_env("HalfCheetah-v5", seed=0, from_pixels=True, image_size=64)
    assert env.observation_spec["observation"].shape == (3, 64, 64)
    td = env.rollout(3)
    obs = td["next", "observation"]
    assert obs.shape == (3, 3, 64, 64) and obs.dtype == torch.uint8
    assert obs.float().std() > 10  # a rendered scene, not a blank frame
    assert "pixels" not in td.keys(True) and td["next", "episode_reward"].shape == (3, 1)


def test_pixel_encoder_handles_leading_batch_dims():
    encoder = PixelEncoder(in_channels=3, image_size=64)
    frames = torch.randint(0, 256, (2, 5, 3, 64, 64), dtype=torch.uint8)
    out = encoder(frames)
    assert out.shape == (2, 5, encoder.out_features) and out.dtype == torch.float32
