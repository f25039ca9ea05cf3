"""dm_control suite tasks (``dmc:<domain>-<task>``): names, the dm_control 1.0.50 / MuJoCo 4 bridge, and the torchrl
env of a task (state vector or camera images)."""
from __future__ import annotations

import functools
import importlib

import numpy as np

from shared import compat
from shared.config import ConfigError
from shared.rendering import fast_render, headless_gl


DMC_PREFIX = "dmc:"
DMC_INSTALL = "pip install -e '.[dmc]'"


def is_dmc(name: str) -> bool:
    """Whether ``name`` names a dm_control suite task (``dmc:<domain>-<task>``, e.g. ``dmc:cheetah-run``)."""
    return str(name).startswith(DMC_PREFIX)


def dmc_suite(name: str):
    """``dm_control.suite``, or ConfigError naming the missing extra."""
    headless_gl()  # dm_control picks its OpenGL backend when first imported
    try:
        suite = importlib.import_module("dm_control.suite")
    except ImportError:
        raise ConfigError(f"env.name={name!r} needs dm_control; install it with: {DMC_INSTALL}") from None
    _dmc_mujoco4_compat()
    return suite


@functools.lru_cache(maxsize=1)
def _dmc_mujoco4_compat() -> None:
    """dm_control 1.0.50 names a few flex arrays (``flex_vertedge``, ``flexvert_J``, ...) that MuJoCo 4 dropped, so
    building any suite task fails with AttributeError. Forget the arrays the installed MuJoCo lacks (no suite task
    uses flexes; all 51 tasks then load, step and render). A no-op where the versions match."""
    import mujoco
    from dm_control.mujoco.wrapper.mjbindings import sizes

    model = mujoco.MjModel.from_xml_string("<mujoco/>")
    for struct_name, struct in (("mjmodel", model), ("mjdata", mujoco.MjData(model))):
        fields = sizes.array_sizes.get(struct_name, {})
        for field in [f for f in fields if not hasattr(struct, f)]:
            del fields[field]


def dmc_task(name: str) -> tuple[str, str]:
    """``(domain, task)`` of ``dmc:<domain>-<task>``; ConfigError (listing what is allowed) unless it is a suite task.

    Domains and tasks contain underscores, never hyphens, so the first ``-`` splits them (``dmc:ball_in_cup-catch``).
    """
    suite = dmc_suite(name)
    domain, _, task = str(name)[len(DMC_PREFIX):].partition("-")
    tasks: dict[str, list[str]] = {}
    for d, t in suite.ALL_TASKS:
        tasks.setdefault(d, []).append(t)
    if domain not in tasks:
        raise ConfigError(f"env.name={name!r}: unknown dm_control domain {domain!r}; allowed: dmc:<domain>-<task> with "
                          f"domain one of {', '.join(sorted(tasks))} (e.g. dmc:cheetah-run, dmc:walker-walk)")
    if task not in tasks[domain]:
        raise ConfigError(f"env.name={name!r}: unknown task {task!r} for dm_control domain {domain!r}; allowed: "
                          + ", ".join(f"dmc:{domain}-{t}" for t in tasks[domain]))
    return domain, task


def dmc_base(name: str, *, render: bool, from_pixels: bool, image_size: int):
    from torchrl.envs import DMControlEnv, DMControlWrapper

    domain, task = dmc_task(name)
    if not from_pixels:
        env = DMControlEnv(domain, task)
    else:  # DMControlEnv forwards extra kwargs to the task, so the render size goes through the wrapper
        suite = dmc_suite(name)
        raw = suite.load(domain, task)
        fast_render(raw.physics.model)
        env = DMControlWrapper(raw, from_pixels=True, pixels_only=True,
                               render_kwargs={"height": image_size, "width": image_size, "camera_id": 0})
    if render:
        _attach_dmc_render(compat.gym_env_of(env))
    return env


def _attach_dmc_render(dm_env, height: int = 240, width: int = 320, camera_id: int = 0) -> None:
    """Give a dm_control env a Gymnasium-style ``render()`` returning an RGB frame ``[H, W, 3]`` uint8, so video code
    that calls ``compat.gym_env_of(env).render()`` works for both backends."""
    physics = dm_env.physics
    dm_env.render = lambda: np.array(physics.render(height=height, width=width, camera_id=camera_id), copy=True)
