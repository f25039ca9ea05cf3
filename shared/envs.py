"""Environments shared by both engines.

Atari goes through ``ale_py.vector_env.AtariVectorEnv``, which does the whole standard preprocessing (frame skip with
max-pooling, noop reset, fire reset, resize, grey, frame stack) in C++ threads; a torchrl ``GymEnv`` + transform stack
is ~15x slower per step on this machine (DESIGN.md), and the A3C hot loop is bound by the per-step env cost.
Episodic life and reward clipping are applied here, on top, so that they shape only the training signal while the
reported episode returns stay the real game scores.

Gymnasium/MuJoCo ids go through torchrl's ``GymEnv`` and dm_control suite tasks (``dmc:<domain>-<task>``) through
``DMControlEnv``; both can give state vectors (float32 ``"observation"``) or, with ``from_pixels=True``, camera images
(uint8 ``"observation"`` ``[3, H, W]``, rendered at ``image_size`` directly, shadows and reflections off).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import re
from dataclasses import dataclass

import numpy as np

from shared import compat
from shared.config import ConfigError


@functools.lru_cache(maxsize=1)
def atari_games() -> dict[str, str]:
    """Map every short ALE game name (``SpaceInvaders``) to its ROM id (``space_invaders``)."""
    from ale_py.roms import get_all_rom_ids

    return {"".join(part.capitalize() for part in rom.split("_")): rom for rom in get_all_rom_ids()}


def atari_rom(name: str) -> str | None:
    """ROM id for a short name (``Pong``), a ROM id (``pong``) or a full id (``ALE/Pong-v5``, ``PongNoFrameskip-v4``)."""
    bare = re.sub(r"^ALE/", "", name)
    bare = re.sub(r"-v\d+$", "", bare)
    bare = re.sub(r"(NoFrameskip|Deterministic)$", "", bare)
    roms = set(atari_games().values())
    if bare in roms:
        return bare
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", bare).lower()
    if snake in roms:
        return snake
    return atari_games().get(bare)


GAME_KEYS = ("game_over", "game_score", "game_length")  # whole Atari games, in a step's info (AtariSignals)


def is_atari(name: str) -> bool:
    """Whether ``name`` is an ALE game in any spelling A3C accepts (``Pong``, ``pong``, ``ALE/Pong-v5``,
    ``PongNoFrameskip-v4``); such names always go through the shared Atari stack, never plain Gymnasium."""
    return not is_dmc(name) and atari_rom(str(name)) is not None


def check_atari_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is an ALE game."""
    if atari_rom(str(name)) is None:
        raise ConfigError(
            f"env.name={name!r} is not an ALE game; allowed: a short name ({', '.join(sorted(atari_games()))}) "
            "or a full id such as ALE/Pong-v5"
        )


@dataclass
class AtariSettings:
    """The Atari preprocessing stack (the keys of a config's ``env`` section)."""

    name: str = "Pong"
    frame_skip: int = 4
    frame_stack: int = 4
    image_size: int = 84
    grayscale: bool = True
    noop_max: int = 30
    fire_reset: bool = True
    episodic_life: bool = True
    clip_rewards: bool = True
    sticky_actions: float = 0.0
    max_episode_frames: int = 108_000

    @classmethod
    def from_config(cls, env_cfg) -> "AtariSettings":
        fields = cls.__dataclass_fields__
        return cls(**{k: env_cfg[k] for k in fields if k in env_cfg})

    @property
    def channels(self) -> int:
        return self.frame_stack * (1 if self.grayscale else 3)


@functools.lru_cache(maxsize=None)
def fire_action(rom: str) -> int | None:
    """The index of FIRE in the game's minimal action set (None for games without it)."""
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    game = "".join(part.capitalize() for part in rom.split("_"))
    env = gymnasium.make(f"ALE/{game}-v5")
    try:
        meanings = env.unwrapped.get_action_meanings()
    finally:
        env.close()
    return meanings.index("FIRE") if "FIRE" in meanings else None


def make_atari_vector_env(settings: AtariSettings, num_envs: int, *, train: bool, num_threads: int = 1):
    """The one Atari factory of both engines: ``num_envs`` games of ``settings.name`` preprocessed in C++ by
    ``AtariVectorEnv`` (same-step autoreset), with the training signal of :class:`AtariSignals` on top."""
    from ale_py.vector_env import AtariVectorEnv

    env = AtariVectorEnv(
        atari_rom(settings.name), num_envs, num_threads=num_threads, frameskip=settings.frame_skip,
        stack_num=settings.frame_stack, img_height=settings.image_size, img_width=settings.image_size,
        grayscale=settings.grayscale, noop_max=settings.noop_max, use_fire_reset=settings.fire_reset,
        repeat_action_probability=settings.sticky_actions, max_num_frames_per_episode=settings.max_episode_frames,
        # ALE's own episodic_life restarts the whole game at a lost life, and its clipping hides the real scores:
        # both are done in AtariSignals instead
        episodic_life=False, reward_clipping=False, autoreset_mode="SameStep",
    )
    return AtariSignals(env, settings, train=train)


class AtariSignals:
    """A Gymnasium vector env over ``AtariVectorEnv`` that separates the training signal from the game.

    - A lost life is reported as ``info["life_lost"]`` (with ``train`` and ``episodic_life``) while the same game goes
      on: the consumer ends the *training* episode there (DeepMind's EpisodicLifeEnv), the env never resets for it.
    - With ``train`` and ``clip_rewards``, rewards are ``sign(r)``.
    - Whole games are reported in ``info``: ``game_over`` and its raw ``game_score`` and ``game_length`` (agent
      steps; also under ``final_info``, where same-step autoreset readers such as torchrl's look for a finished
      game's values), so returns stay real scores.
    - After a lost life, games with a FIRE action get FIRE as their next action (with ``fire_reset``): Breakout and
      the like relaunch the ball only on FIRE, and a greedy policy that never presses it would stall until the cap.
    """

    def __init__(self, env, settings: AtariSettings, *, train: bool):
        self.env, self.settings = env, settings
        self.num_envs = env.num_envs
        self.single_observation_space, self.single_action_space = env.single_observation_space, env.single_action_space
        self.observation_space, self.action_space = env.observation_space, env.action_space
        self.metadata, self.autoreset_mode = env.metadata, env.autoreset_mode
        self.render_mode, self.spec, self.closed = None, None, False
        self.episodic_life = train and settings.episodic_life
        self.clip_rewards = train and settings.clip_rewards
        self.fire = fire_action(atari_rom(settings.name)) if settings.fire_reset else None
        self._lives = np.zeros(self.num_envs, dtype=np.int32)
        self._score = np.zeros(self.num_envs, dtype=np.float64)
        self._length = np.zeros(self.num_envs, dtype=np.int64)
        self._fire_next = np.zeros(self.num_envs, dtype=bool)

    @property
    def unwrapped(self):
        return self.env

    def reset(self, *, seed=None, options=None):
        obs, info = self.env.reset(seed=seed, options=options)
        self._lives[:] = info["lives"]
        self._score[:] = 0
        self._length[:] = 0
        self._fire_next[:] = False
        return obs, self._with_game_keys(info, np.zeros(self.num_envs, dtype=bool))

    def _with_game_keys(self, info: dict, game_over: np.ndarray, life_lost: np.ndarray | None = None) -> dict:
        info["game_over"] = game_over
        info["game_score"] = np.where(game_over, self._score, 0.0)
        info["game_length"] = np.where(game_over, self._length, 0)
        info["life_lost"] = np.zeros(self.num_envs, dtype=bool) if life_lost is None else life_lost
        return info

    def step(self, actions):
        actions = np.asarray(actions, dtype=np.int32).reshape(self.num_envs).copy()
        if self.fire is not None:
            actions[self._fire_next] = self.fire
        obs, reward, terminated, truncated, info = self.env.step(actions)
        game_over = terminated | truncated
        self._score += reward
        self._length += 1
        life_lost = (info["lives"] < self._lives) & ~game_over  # at a game over, lives are the next game's
        self._lives[:] = info["lives"]
        self._fire_next = life_lost
        info = self._with_game_keys(info, game_over, life_lost if self.episodic_life else None)
        if game_over.any():
            info["final_info"] = {k: info[k] for k in (*GAME_KEYS, "life_lost")}
        self._score[game_over] = 0
        self._length[game_over] = 0
        if self.clip_rewards:
            reward = np.sign(reward)
        return obs, reward.astype(np.float32), terminated, truncated, info

    def close(self) -> None:
        if not self.closed:
            self.env.close()
            self.closed = True


@dataclass
class AtariStep:
    """One step of an :class:`AtariBatch`: the next observations (for a finished game already the next game's first)
    and the training signal: clipped ``reward``; ``done`` where a training episode ended (game over, frame cap or,
    with episodic life, a lost life); ``terminated`` where it ended for real (not at the frame cap, where the value
    must be bootstrapped from ``final_obs``, the capped game's last observation); and the whole games that ended, as
    ``(env_index, score, agent_steps)``."""

    obs: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    terminated: np.ndarray
    final_obs: np.ndarray
    finished: list[tuple[int, float, int]]


class AtariBatch:
    """``num_envs`` Atari games stepped together (A3C's env); observations are uint8 ``[E, C, H, W]``; ``step``
    returns an :class:`AtariStep` (the training signal of :class:`AtariSignals`)."""

    def __init__(self, settings: AtariSettings, num_envs: int, seed: int, num_threads: int = 1):
        self.settings = settings
        self.num_envs = num_envs
        self.seed = seed
        self._env = make_atari_vector_env(settings, num_envs, train=True, num_threads=num_threads)
        self.num_actions = int(self._env.single_action_space.n)

    def _format(self, obs: np.ndarray) -> np.ndarray:
        if not self.settings.grayscale:  # [E, S, H, W, 3] -> [E, S*3, H, W]
            e, s, h, w, c = obs.shape
            obs = obs.transpose(0, 1, 4, 2, 3).reshape(e, s * c, h, w)
        return obs

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self.seed)
        return self._format(obs)

    def step(self, actions: np.ndarray) -> AtariStep:
        obs, reward, terminated, truncated, info = self._env.step(actions)
        finished = [(int(i), float(info["game_score"][i]), int(info["game_length"][i]))
                    for i in np.flatnonzero(info["game_over"])]
        terminated = (terminated & ~truncated) | info["life_lost"]
        final_obs = self._format(info["final_obs"]) if truncated.any() else None
        return AtariStep(self._format(obs), reward, terminated | truncated, terminated, final_obs, finished)

    def close(self) -> None:
        self._env.close()


DMC_PREFIX = "dmc:"
DMC_INSTALL = "pip install -e '.[dmc]'"


def is_dmc(name: str) -> bool:
    """Whether ``name`` names a dm_control suite task (``dmc:<domain>-<task>``, e.g. ``dmc:cheetah-run``)."""
    return str(name).startswith(DMC_PREFIX)


def _dmc_suite(name: str):
    """``dm_control.suite``, or ConfigError naming the missing extra."""
    _headless_gl()  # dm_control picks its OpenGL backend when first imported
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
    suite = _dmc_suite(name)
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


def check_gym_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is a registered Gymnasium id (MuJoCo ids included) or a dm_control task."""
    if is_dmc(name):
        dmc_task(name)
        return
    if name not in _gym_ids():
        examples = "CartPole-v1, Pendulum-v1, HalfCheetah-v5, Hopper-v5, Humanoid-v5, Pong, dmc:cheetah-run"
        raise ConfigError(f"env.name={name!r} is not a Gymnasium id or an ALE game; allowed: e.g. {examples} "
                          "(a dm_control task is dmc:<domain>-<task>)")


def _headless_gl() -> None:
    """Render MuJoCo offscreen through EGL when no backend is chosen and there is no display (set before the first
    MuJoCo/dm_control render context is made)."""
    if "MUJOCO_GL" not in os.environ and not os.environ.get("DISPLAY"):
        os.environ["MUJOCO_GL"] = "egl"


def fast_render(model) -> None:
    """Cheap offscreen rendering for a MuJoCo model (``mujoco.MjModel`` or dm_control's wrapper): no shadows, no
    reflections, no multisampling. On this CPU (llvmpipe) a 64x64 frame drops from ~120-170 ms to ~5-15 ms, and the
    bodies stay clearly visible. Call it before the first render (multisampling is fixed when the GL context is made).
    Physics is unchanged."""
    model.light_castshadow[:] = 0
    model.mat_reflectance[:] = 0
    model.vis.quality.offsamples = 0


def _gym_base(name: str, *, render: bool, from_pixels: bool, image_size: int):
    """One Gymnasium env; with pixels, rendered at ``image_size`` directly (MuJoCo envs take the renderer's
    width/height through ``gym.make``; no resize, torchvision is absent) under the key ``"pixels"``."""
    import gymnasium
    from torchrl.envs import GymEnv, GymWrapper

    if not (render or from_pixels):
        return GymEnv(name)
    kwargs = {"width": image_size, "height": image_size} if from_pixels else {}
    try:
        env = gymnasium.make(name, render_mode="rgb_array", disable_env_checker=True, **kwargs)
    except TypeError as err:
        raise ConfigError(f"env.name={name!r} with env.from_pixels=true is not allowed ({err}); allowed: a MuJoCo "
                          "Gymnasium id (HalfCheetah-v5, Hopper-v5, ...) or a dm_control task") from None
    if hasattr(env.unwrapped, "mujoco_renderer"):
        if from_pixels:
            fast_render(env.unwrapped.model)
        env = _current_gl_context_wrapper()(env)
    if from_pixels:
        env = gymnasium.wrappers.AddRenderObservation(env, render_only=True)
    return GymWrapper(env, from_pixels=from_pixels, pixels_only=True)


@functools.lru_cache(maxsize=1)
def _current_gl_context_wrapper() -> type:
    import gymnasium

    class CurrentGLContext(gymnasium.Wrapper):
        """Render with this MuJoCo env's own OpenGL context current, then give the thread back its previous one.

        Gymnasium's renderer assumes its context stays current, so with two rendering envs in one process
        (``SerialEnv`` copies, train + eval envs) all but the last one made render black frames; dm_control, which
        remembers which of its contexts is current, drew untextured frames after a Gymnasium render.
        """

        def render(self):
            with _keep_current_egl_context():
                compat.make_mujoco_context_current(self.env)
                return self.env.render()

    return CurrentGLContext


@contextlib.contextmanager
def _keep_current_egl_context():
    """Make the thread's current EGL context current again on exit (a no-op for other OpenGL backends)."""
    if os.environ.get("MUJOCO_GL") != "egl":
        yield
        return
    from mujoco.egl import egl_ext as EGL

    previous = (EGL.eglGetCurrentDisplay(), EGL.eglGetCurrentSurface(EGL.EGL_DRAW),
                EGL.eglGetCurrentSurface(EGL.EGL_READ), EGL.eglGetCurrentContext())
    try:
        yield
    finally:
        if previous[-1]:
            EGL.eglMakeCurrent(*previous)


def _dmc_base(name: str, *, render: bool, from_pixels: bool, image_size: int):
    from torchrl.envs import DMControlEnv, DMControlWrapper

    domain, task = dmc_task(name)
    if not from_pixels:
        env = DMControlEnv(domain, task)
    else:  # DMControlEnv forwards extra kwargs to the task, so the render size goes through the wrapper
        suite = _dmc_suite(name)
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


def render_frame(env) -> np.ndarray:
    """An RGB frame ``[H, W, 3]`` uint8 (a copy) of a single env made by :func:`make_env` with ``render=True``."""
    return np.array(compat.gym_env_of(env).render(), copy=True)  # rendered frames have negative strides


def make_env(name: str, *, seed: int = 0, num_envs: int = 1, render: bool = False,
             atari: AtariSettings | None = None, train: bool = True, from_pixels: bool = False, image_size: int = 64):
    """A torchrl env for a Gymnasium/MuJoCo id, a dm_control task or an ALE game, with the episode return in
    ``("next", "episode_reward")``.

    Observations are under ``"observation"``: float32 vectors for state-based Gymnasium/dm_control envs (dm_control's
    observation dict is concatenated, keys in sorted order); uint8 ``[3, image_size, image_size]`` camera images with
    ``from_pixels=True`` (Gymnasium MuJoCo ids and dm_control tasks; scale by 1/255 in the network, e.g.
    :class:`shared.models.PixelEncoder`); uint8 ``[C, H, W]`` stacks for ALE games.

    Gymnasium ids go through ``GymEnv`` (``num_envs > 1`` batches them as one vector env, batch ``[num_envs]``;
    with pixels, a ``SerialEnv``). dm_control tasks (``dmc:<domain>-<task>``) go through ``DMControlEnv``
    (``num_envs > 1``: a ``SerialEnv``). ALE games go through ``AtariVectorEnv`` wrapped by torchrl's ``GymWrapper``
    (the whole Atari preprocessing in C++); with ``train=False`` reward clipping and episodic life are off, so
    returns are real game scores. ``render=True`` (Gymnasium and dm_control, single env) makes
    ``render_frame(env)`` return RGB frames for videos.
    """
    from torchrl.envs import (CatTensors, Compose, DoubleToFloat, GymEnv, GymWrapper, PermuteTransform,
                              RenameTransform, RewardSum, SerialEnv, TransformedEnv)

    if is_atari(name):
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
    if from_pixels or render or is_dmc(name):
        _headless_gl()
    options = {"render": render, "from_pixels": from_pixels, "image_size": image_size}
    single = functools.partial(_dmc_base if is_dmc(name) else _gym_base, name, **options)
    if num_envs == 1:
        base = single()
    elif is_dmc(name) or from_pixels:
        base = SerialEnv(num_envs, single)
    else:  # one Gymnasium vector env
        base = GymEnv(name, num_envs=num_envs, **({"render_mode": "rgb_array"} if render else {}))
    transforms = []
    if from_pixels:  # [H, W, 3] uint8 "pixels" -> [3, H, W] uint8 "observation" (kept uint8 for the replay buffer)
        transforms += [RenameTransform(["pixels"], ["observation"]),
                       PermuteTransform((-1, -3, -2), in_keys=["observation"])]
    elif is_dmc(name):
        keys = [k for k in base.observation_spec.keys(True, True)]
        transforms.append(CatTensors(in_keys=keys, out_key="observation", unsqueeze_if_oor=True))
    env = TransformedEnv(base, Compose(*transforms, DoubleToFloat(), RewardSum()))
    env.set_seed(seed)
    return env


@functools.lru_cache(maxsize=1)
def _gym_ids() -> frozenset:
    import gymnasium

    return frozenset(gymnasium.registry)
