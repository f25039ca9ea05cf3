"""The torchrl env of any name both engines take: a Gymnasium/MuJoCo id (``gymnasium.make`` in the fault guard of
shared/env_guard.py, then ``GymWrapper``), an env of the user's own package (``module:EnvId``, Gymnasium's form), a
dm_control suite task (``dmc:<domain>-<task>``, shared/dmc.py) or an ALE game (the shared Atari stack,
shared/atari.py); state vectors (float32 ``"observation"``) or, with ``from_pixels=True``, camera images (uint8
``"observation"`` ``[3, H, W]``, rendered at ``image_size`` directly, shadows and reflections off,
shared/rendering.py).
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from pathlib import Path

from shared.atari import GAME_KEYS, AtariSettings, is_atari, make_atari_vector_env
from shared.config import ConfigError
from shared.dmc import dmc_base, dmc_task, is_dmc
from shared.env_guard import first_line, make_gym
from shared.rendering import current_gl_context_wrapper, fast_render, headless_gl


def import_own_env(name: str) -> str:
    """The Gymnasium id of ``name``: for an own env, ``module:EnvId`` (Gymnasium's form, e.g.
    ``my_pkg.envs:MyEnv-v0``), ``module`` is imported first, which registers its ids; other names are ids already.
    Every process that makes the env goes through here (or through ``gymnasium.make``, which imports the same way),
    so training, evaluation, a resumed run, env worker processes and Ray collector actors all import the module from
    the name alone. A module that cannot be imported is a ConfigError."""
    if is_dmc(name) or ":" not in name:
        return name
    module, *env_id = name.split(":")
    if not module or len(env_id) != 1 or not env_id[0]:
        raise ConfigError(f"env.name={name!r} is not allowed; allowed: module:EnvId (one colon, e.g. "
                          "my_pkg.envs:MyEnv-v0), a Gymnasium id, an ALE game or dmc:<domain>-<task>")
    try:
        importlib.import_module(module)
    except ImportError as exc:  # the module, or a package it needs, is missing
        raise ConfigError(f"env.name={name!r}: module {module!r} cannot be imported ({exc}); allowed: a module on "
                          "PYTHONPATH (or installed) that registers the id with gymnasium.register") from None
    except Exception as exc:  # noqa: BLE001 - the user's module raised while it ran (a SyntaxError, a RuntimeError...)
        where = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) else ""
        raise ConfigError(f"env.name={name!r}: importing module {module!r} raised {type(exc).__name__}{where}: "
                          f"{first_line(exc)}; allowed: a module that imports without an error") from None
    return env_id[0]



def _ids_of(module: str) -> list[str]:
    """The registered Gymnasium ids whose entry point lives in ``module``'s top-level package."""
    import gymnasium

    package = module.split(".")[0]
    ids = []
    for env_id, spec in gymnasium.registry.items():
        entry = spec.entry_point
        where = entry if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
        if where.split(".")[0].split(":")[0] == package:
            ids.append(env_id)
    return sorted(ids)


def env_kind(name: str) -> str:
    """Which stack makes the env ``name``: ``atari`` (an ALE game, in any spelling A3C accepts), ``dmc`` (a dm_control
    task, ``dmc:<domain>-<task>``) or ``gymnasium`` (a Gymnasium id or an own ``module:EnvId``). The one place the kind
    is read off a name; the off-policy config carries the answer as ``env.kind``."""
    if is_dmc(name):
        return "dmc"
    return "atari" if is_atari(name) else "gymnasium"


def check_gym_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is a registered Gymnasium id (MuJoCo ids included), an own env's
    ``module:EnvId`` whose module registers ``EnvId``, or a dm_control task."""
    import gymnasium

    if is_dmc(name):
        dmc_task(name)
        return
    examples = "CartPole-v1, Pendulum-v1, HalfCheetah-v5, Hopper-v5, Humanoid-v5, Pong, dmc:cheetah-run"
    env_id = import_own_env(name)
    if env_id not in gymnasium.registry:  # read now: the import above may just have added ids
        if env_id != name:
            module = name.split(":")[0]
            registered = _ids_of(module)
            raise ConfigError(f"env.name={name!r}: module {module!r} registers no Gymnasium id {env_id!r}; allowed: "
                              + (f"an id it registers ({', '.join(registered)})" if registered else
                                 "an id it registers with gymnasium.register (it registers none)"))
        raise ConfigError(f"env.name={name!r} is not a Gymnasium id or an ALE game; allowed: e.g. {examples} "
                          "(a dm_control task is dmc:<domain>-<task>; an env of your own package is "
                          "module:EnvId)")
    from gymnasium.spaces import Box

    space = _observation_space(name)
    if not (isinstance(space, Box) and space.shape):
        raise ConfigError(f"env.name={name!r} observes {space}; allowed: an env with a Box observation (a vector or "
                          f"an image), e.g. {examples}")


def _entry_module(env_id: str) -> str:
    """The module that holds Gymnasium id ``env_id``'s entry point."""
    import gymnasium

    entry = gymnasium.spec(env_id).entry_point
    return entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "") or ""


def warn_unless_found_by_name(name: str) -> None:
    """Print a warning when the bare id ``name`` is registered by a module this process imported by hand (or by the
    script itself): training here works, but a resume, ``evaluate``, ``export`` and env worker processes make the env
    from the name alone and will not find it. Gymnasium's own ids, ALE's and those of installed Gymnasium plugins are
    found by name."""
    from importlib.metadata import entry_points

    module = _entry_module(name)
    package = module.split(".")[0]
    if package in {"gymnasium", "ale_py"} | {ep.module.split(".")[0] for ep in entry_points(group="gymnasium.envs")}:
        return
    if module == "__main__":
        advice = "define the env in a module of its own and use env.name=<module>:" + name
    else:
        advice = f"use env.name={module}:{name}, which imports it wherever the env is made"
    print(f"warning: env.name={name!r} is registered by {module or 'code'} that this process imported by hand; a "
          f"resume, offpolicy.evaluate / export and env worker processes make the env from its name alone and will "
          f"not find it; {advice}", file=sys.stderr)


def check_renders(name: str) -> None:
    """A ConfigError unless Gymnasium id ``name`` renders frames here (what ``eval.video=true`` records): classic
    control needs pygame, MuJoCo an offscreen GL."""
    import gymnasium

    try:
        env = gymnasium.make(name, render_mode="rgb_array", disable_env_checker=True)
        try:
            env.reset(seed=0)
            frame = env.render()
        finally:
            env.close()
    except gymnasium.error.DependencyNotInstalled as exc:
        raise ConfigError(f"eval.video=true cannot render env.name={name!r} here ({str(exc).splitlines()[0]}); "
                          "allowed: eval.video=false, or install what it names") from None
    except Exception as exc:  # noqa: BLE001 - an env of the user's own: no render(), no render_mode argument, ...
        raise ConfigError(f"eval.video=true cannot render env.name={name!r} (render_mode='rgb_array': "
                          f"{type(exc).__name__}: {first_line(exc)}); allowed: eval.video=false, or an env whose "
                          "render() returns RGB frames") from None
    if not (hasattr(frame, "shape") and len(frame.shape) == 3 and frame.shape[-1] == 3):
        raise ConfigError(f"eval.video=true cannot render env.name={name!r}: its render() with "
                          f"render_mode='rgb_array' returned {type(frame).__name__}, not an RGB frame; allowed: "
                          "eval.video=false, or an env whose render() returns [H, W, 3] frames")


@functools.lru_cache(maxsize=None)
def _observation_space(name: str):
    """The Gymnasium env's observation space (made once, then closed); a missing optional package is a ConfigError."""
    import gymnasium

    try:
        env = gymnasium.make(name, disable_env_checker=True)
    except gymnasium.error.DependencyNotInstalled as exc:
        raise ConfigError(f"env.name={name!r} needs a package that is not installed ({str(exc).splitlines()[0]}); "
                          "allowed: an env whose packages are installed") from None
    try:
        return env.observation_space
    finally:
        env.close()


def _gym_base(name: str, *, render: bool, from_pixels: bool, image_size: int, fault_report: Path | None):
    """One Gymnasium env; with pixels, rendered at ``image_size`` directly (MuJoCo envs take the renderer's
    width/height through ``gym.make``; no resize, torchvision is absent) under the key ``"pixels"``."""
    import gymnasium
    from torchrl.envs import GymWrapper

    if not (render or from_pixels):
        return GymWrapper(make_gym(name, fault_report))
    kwargs = {"width": image_size, "height": image_size} if from_pixels else {}
    try:
        env = make_gym(name, fault_report, render_mode="rgb_array", disable_env_checker=True, **kwargs)
    except TypeError as err:
        raise ConfigError(f"env.name={name!r} with env.from_pixels=true is not allowed ({err}); allowed: a MuJoCo "
                          "Gymnasium id (HalfCheetah-v5, Hopper-v5, ...) or a dm_control task") from None
    if hasattr(env.unwrapped, "mujoco_renderer"):
        if from_pixels:
            fast_render(env.unwrapped.model)
        env = current_gl_context_wrapper()(env)
    if from_pixels:
        env = gymnasium.wrappers.AddRenderObservation(env, render_only=True)
    return GymWrapper(env, from_pixels=from_pixels, pixels_only=True)


def make_env(name: str, *, seed: int = 0, num_envs: int = 1, render: bool = False,
             atari: AtariSettings | None = None, train: bool = True, from_pixels: bool = False, image_size: int = 64,
             fault_report: Path | None = None, kind: str | None = None):
    """A torchrl env for a Gymnasium/MuJoCo id, an own env (``module:EnvId``, its module imported first), a
    dm_control task or an ALE game, with the episode return in ``("next", "episode_reward")``.

    Observations are under ``"observation"``: float32 vectors for state-based Gymnasium/dm_control envs (dm_control's
    observation dict is concatenated, keys in sorted order); uint8 ``[3, image_size, image_size]`` camera images with
    ``from_pixels=True`` (Gymnasium MuJoCo ids and dm_control tasks; scale by 1/255 in the network, e.g.
    :class:`shared.models.PixelEncoder`); uint8 ``[C, H, W]`` stacks for ALE games.

    Gymnasium ids are made by ``gymnasium.make`` inside shared/env_guard.py's guard (a failure of the env is an
    ``EnvFault``; with ``fault_report``, a directory, also written there for a caller in another process) and wrapped
    by ``GymWrapper``; dm_control tasks (``dmc:<domain>-<task>``) go through ``DMControlEnv``; ``num_envs > 1``: a
    ``SerialEnv`` of either. ALE games go through ``AtariVectorEnv`` wrapped by torchrl's ``GymWrapper`` (the whole
    Atari preprocessing in C++); with ``train=False`` reward clipping and episodic life are off, so returns are real
    game scores. ``render=True`` (Gymnasium and dm_control, single env) makes ``render_frame(env)`` return RGB frames
    for videos. ``kind``: the env's kind as a composed config holds it (``cfg.env.kind``); None: read off ``name``.
    """
    from torchrl.envs import (CatTensors, Compose, DoubleToFloat, GymWrapper, PermuteTransform, RenameTransform,
                              RewardSum, SerialEnv, TransformedEnv)

    kind = kind or env_kind(name)
    if kind == "atari":
        import torch
        from torchrl.data import Composite, Unbounded
        from torchrl.envs.gym_like import default_info_dict_reader

        settings = dataclasses.replace(atari or AtariSettings(), name=name)
        # same-step autoreset: torchrl's GymWrapper refuses NextStep
        base = GymWrapper(make_atari_vector_env(settings, num_envs, train=train))
        keys = (*GAME_KEYS, "life_lost")
        games = Composite({key: Unbounded(shape=(num_envs,), dtype=dtype) for key, dtype in
                           zip(keys, (torch.bool, torch.float64, torch.int64, torch.bool))}, shape=(num_envs,))
        base.set_info_dict_reader(default_info_dict_reader(list(keys), spec=games))  # ("next", "game_*")
        base.set_seed(seed)
        return TransformedEnv(base, RewardSum())
    check_gym_name(name)
    if from_pixels or render or kind == "dmc":
        headless_gl()
    options = {"render": render, "from_pixels": from_pixels, "image_size": image_size}
    single = functools.partial(dmc_base, name, **options) if kind == "dmc" else functools.partial(
        _gym_base, name, **options, fault_report=fault_report)
    base = single() if num_envs == 1 else SerialEnv(num_envs, single)
    transforms = []
    if from_pixels:  # [H, W, 3] uint8 "pixels" -> [3, H, W] uint8 "observation" (kept uint8 for the replay buffer)
        transforms += [RenameTransform(["pixels"], ["observation"]),
                       PermuteTransform((-1, -3, -2), in_keys=["observation"])]
    elif kind == "dmc":
        keys = [k for k in base.observation_spec.keys(True, True)]
        transforms.append(CatTensors(in_keys=keys, out_key="observation", unsqueeze_if_oor=True))
    env = TransformedEnv(base, Compose(*transforms, DoubleToFloat(), RewardSum()))
    env.set_seed(seed)
    return env
