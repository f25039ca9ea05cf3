"""Environments shared by both engines.

Atari goes through ``ale_py.vector_env.AtariVectorEnv``, which does the whole standard preprocessing (frame skip with
max-pooling, noop reset, fire reset, resize, grey, frame stack) in C++ threads; a torchrl ``GymEnv`` + transform stack
is ~15x slower per step on this machine (DESIGN.md), and the A3C hot loop is bound by the per-step env cost.
Episodic life and reward clipping are applied here, on top, so that they shape only the training signal while the
reported episode returns stay the real game scores.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

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


class AtariBatch:
    """``num_envs`` Atari games stepped together; observations are uint8 ``[E, C, H, W]``.

    ``step`` returns the training signal (clipped reward, done on life loss when ``episodic_life``) and the list of
    real episodes that ended, as ``(env_index, score, agent_steps)``. Truncated episodes count as done; with same-step autoreset
    the observation returned for a finished game is already the first one of the next game.
    """

    def __init__(self, settings: AtariSettings, num_envs: int, seed: int, num_threads: int = 1):
        from ale_py.vector_env import AtariVectorEnv

        self.settings = settings
        self.num_envs = num_envs
        self._env = AtariVectorEnv(
            atari_rom(settings.name),
            num_envs,
            num_threads=num_threads,
            frameskip=settings.frame_skip,
            stack_num=settings.frame_stack,
            img_height=settings.image_size,
            img_width=settings.image_size,
            grayscale=settings.grayscale,
            noop_max=settings.noop_max,
            use_fire_reset=settings.fire_reset,
            repeat_action_probability=settings.sticky_actions,
            max_num_frames_per_episode=settings.max_episode_frames,
            episodic_life=False,  # applied below from `lives`, so scores stay whole-game
            reward_clipping=False,  # applied below, so scores stay unclipped
            autoreset_mode="SameStep",
        )
        self.num_actions = int(self._env.single_action_space.n)
        self._seed = seed
        self._lives = np.zeros(num_envs, dtype=np.int32)
        self._score = np.zeros(num_envs, dtype=np.float64)
        self._length = np.zeros(num_envs, dtype=np.int64)

    def _format(self, obs: np.ndarray) -> np.ndarray:
        if not self.settings.grayscale:  # [E, S, H, W, 3] -> [E, S*3, H, W]
            e, s, h, w, c = obs.shape
            obs = obs.transpose(0, 1, 4, 2, 3).reshape(e, s * c, h, w)
        return obs

    def reset(self) -> np.ndarray:
        obs, info = self._env.reset(seed=self._seed)
        self._lives[:] = info["lives"]
        self._score[:] = 0
        self._length[:] = 0
        return self._format(obs)

    def step(self, actions: np.ndarray):
        obs, reward, terminated, truncated, info = self._env.step(actions.astype(np.int32, copy=False))
        game_over = terminated | truncated
        self._score += reward
        self._length += 1
        finished = [(int(i), float(self._score[i]), int(self._length[i])) for i in np.flatnonzero(game_over)]
        self._score[game_over] = 0
        self._length[game_over] = 0
        done = game_over
        if self.settings.episodic_life:
            life_lost = (info["lives"] < self._lives) & ~game_over
            done = game_over | life_lost
        self._lives[:] = info["lives"]
        train_reward = np.sign(reward) if self.settings.clip_rewards else reward
        return self._format(obs), train_reward.astype(np.float32), done, finished

    def close(self) -> None:
        self._env.close()


def check_gym_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is a registered Gymnasium id (MuJoCo ids included)."""
    import gymnasium

    if name not in gymnasium.registry:
        examples = "CartPole-v1, Pendulum-v1, HalfCheetah-v5, Hopper-v5, Humanoid-v5"
        raise ConfigError(f"env.name={name!r} is not a Gymnasium id or an ALE game; allowed: e.g. {examples}, Pong")


def make_env(name: str, *, seed: int = 0, num_envs: int = 1, render: bool = False,
             atari: AtariSettings | None = None, train: bool = True):
    """A torchrl env for a Gymnasium/MuJoCo id or an ALE game, with float32 observations and the episode return
    in ``("next", "episode_reward")``.

    Gymnasium ids go through ``GymEnv`` (``num_envs > 1`` batches them as one vector env, batch ``[num_envs]``).
    ALE games go through ``AtariVectorEnv`` wrapped by torchrl's ``GymWrapper`` (the whole Atari preprocessing in C++,
    observations uint8 ``[C, H, W]``); with ``train=False`` reward clipping and episodic life are off, so returns are
    real game scores. ``render=True`` (Gymnasium only) makes ``env.render()`` return RGB frames for videos.
    """
    from torchrl.envs import Compose, DoubleToFloat, GymEnv, GymWrapper, RewardSum, TransformedEnv

    if atari_rom(name) is not None and name not in _gym_ids():
        from ale_py.vector_env import AtariVectorEnv

        s = atari or AtariSettings(name=name)
        base = GymWrapper(AtariVectorEnv(
            atari_rom(name), num_envs, num_threads=1, frameskip=s.frame_skip, stack_num=s.frame_stack,
            img_height=s.image_size, img_width=s.image_size, grayscale=s.grayscale, noop_max=s.noop_max,
            use_fire_reset=s.fire_reset, repeat_action_probability=s.sticky_actions,
            max_num_frames_per_episode=s.max_episode_frames,
            episodic_life=s.episodic_life and train, reward_clipping=s.clip_rewards and train,
            autoreset_mode="SameStep",  # torchrl's GymWrapper refuses NextStep autoreset
        ))
        base.set_seed(seed)
        return TransformedEnv(base, RewardSum())
    check_gym_name(name)
    kwargs = {"render_mode": "rgb_array"} if render else {}
    if num_envs > 1:
        kwargs["num_envs"] = num_envs
    env = TransformedEnv(GymEnv(name, **kwargs), Compose(DoubleToFloat(), RewardSum()))
    env.set_seed(seed)
    return env


@functools.lru_cache(maxsize=1)
def _gym_ids() -> frozenset:
    import gymnasium

    return frozenset(gymnasium.registry)
