"""Atari for both engines: game names, the preprocessing settings, and the one factory of preprocessed games.

``ale_py.vector_env.AtariVectorEnv`` does the whole standard preprocessing (frame skip with max-pooling, noop reset,
fire reset, resize, grey, frame stack) in C++ threads; a torchrl ``GymEnv`` + transform stack is an order of magnitude
slower per step, and the A3C hot loop is bound by the per-step env cost. Episodic life and reward clipping
are applied on top (:class:`AtariSignals`), so that they shape only the training signal while the reported returns
stay the real game scores.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import numpy as np

from shared.config import ConfigError
from shared.dmc import is_dmc


@functools.lru_cache(maxsize=1)
def atari_games() -> dict[str, str]:
    """Map the short name of every ALE game with a single-player mode (``SpaceInvaders``) to its ROM id
    (``space_invaders``): the ``ALE/<name>-v5`` ids ale_py registers with Gymnasium. ROMs with only a multi-player
    mode (Combat, Joust, MazeCraze, Warlords in ale_py 0.12) get no id there, and are not games here either."""
    import ale_py
    import gymnasium

    gymnasium.register_envs(ale_py)
    games = {}
    for spec in gymnasium.registry.values():
        short = re.fullmatch(r"ALE/(\w+)-v5", spec.id)
        if short and str(spec.entry_point).startswith("ale_py"):
            games[short.group(1)] = spec.kwargs["game"]
    return games


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
    return {short.lower(): rom for short, rom in atari_games().items()}.get(bare.lower())  # TicTacToe3d, tictactoe3d


GAME_KEYS = ("game_over", "game_score", "game_length")  # whole Atari games, in a step's info (AtariSignals)


def is_atari(name: str) -> bool:
    """Whether ``name`` is an ALE game in any spelling A3C accepts (``Pong``, ``pong``, ``ALE/Pong-v5``,
    ``PongNoFrameskip-v4``); such names always go through the shared Atari stack, never plain Gymnasium."""
    return not is_dmc(name) and not _other_gym_env(str(name)) and atari_rom(str(name)) is not None


def _other_gym_env(name: str) -> bool:
    """Whether ``name`` is a registered Gymnasium id of something other than ALE (``Blackjack-v1`` is Gymnasium's
    card game, while ``Blackjack`` is the ALE game)."""
    import gymnasium

    spec = gymnasium.registry.get(name)
    return spec is not None and "ale_py" not in str(spec.entry_point)


def check_atari_name(name: str) -> None:
    """Raise ConfigError unless ``name`` is an ALE game with a single-player mode."""
    if atari_rom(str(name)) is None:
        raise ConfigError(
            f"env.name={name!r} is not a single-player ALE game; allowed: a short name "
            f"({', '.join(sorted(atari_games()))}) or a full id such as ALE/Pong-v5"
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

    def describe_frames(self) -> str:
        """What the agent observes, in words (an exported policy's spec): the frames, their layout and the settings of
        ale_py's ``AtariVectorEnv`` that make them (:func:`make_atari_vector_env`)."""
        frames = "grey frames" if self.grayscale else "RGB frames (R, G, B channels per frame)"
        return (f"uint8 0-255 (scaled by 1/255 inside): the last {self.frame_stack} {self.image_size}x{self.image_size} "
                f"{frames} of {self.name} stacked along the channels, oldest first, as ale_py.vector_env."
                f"AtariVectorEnv gives them with frameskip={self.frame_skip} (max-pooled over the last two frames), "
                f"stack_num={self.frame_stack}, img_height=img_width={self.image_size}, grayscale={self.grayscale}, "
                f"noop_max={self.noop_max}, repeat_action_probability={self.sticky_actions}; the evaluation also "
                f"presses FIRE on the step after a lost life in games that have it (fire_reset={self.fire_reset})")


@functools.lru_cache(maxsize=None)
def minimal_action_set(rom: str) -> tuple[str, ...]:
    """The names of the game's minimal action set (``NOOP``, ``FIRE``, ...) in the order of the action indices of its
    ``AtariVectorEnv``, which plays that set (:func:`make_atari_vector_env` leaves ``full_action_space`` off): ALE's
    own list, read from one emulator with the ROM loaded, without a vector env's threads, preprocessing and resets."""
    import ale_py

    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)  # no start-up banner, as ale_py's own AtariEnv
    ale.loadROM(ale_py.roms.get_rom_path(rom))
    return tuple(action.name for action in ale.getMinimalActionSet())


def fire_action(rom: str) -> int | None:
    """The index of FIRE in the game's minimal action set (None for games without it)."""
    actions = minimal_action_set(rom)
    return actions.index("FIRE") if "FIRE" in actions else None


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
      That step reports ``info["fire_forced"]`` and, for every game, ``info["executed_action"]``, so that consumers
      record the action the game ran, not the one they asked for.
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
        # AtariVectorEnv steps all its games together, so the FIRE cannot be an extra emulator step inside one game's
        # life-loss step (as a single-game FireResetEnv does): it takes the game's next step, and the step says so
        forced = self._fire_next
        if forced.any():
            actions[forced] = self.fire
        obs, reward, terminated, truncated, info = self.env.step(actions)
        game_over = terminated | truncated
        self._score += reward
        self._length += 1
        life_lost = (info["lives"] < self._lives) & ~game_over  # at a game over, lives are the next game's
        self._lives[:] = info["lives"]
        self._fire_next = life_lost & (self.fire is not None)
        info["fire_forced"], info["executed_action"] = forced, actions
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
    must be bootstrapped from ``final_obs``, the capped game's last observation); the whole games that ended, as
    ``(env_index, score, agent_steps)``; and the ``action`` each game ran, FIRE where ``fire_forced`` (the step
    after a lost life) whatever was asked."""

    obs: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    terminated: np.ndarray
    final_obs: np.ndarray
    finished: list[tuple[int, float, int]]
    action: np.ndarray
    fire_forced: np.ndarray


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
        return AtariStep(self._format(obs), reward, terminated | truncated, terminated, final_obs, finished,
                         info["executed_action"], info["fire_forced"])

    def close(self) -> None:
        self._env.close()
