"""The shared Atari env: names, the configurable stack, and training signals vs. real scores."""
import numpy as np
import torch
import pytest

from shared.config import ConfigError
from shared.atari import AtariBatch, AtariSettings, atari_rom, check_atari_name, fire_action


@pytest.mark.parametrize("name, rom", [("Pong", "pong"), ("ALE/Pong-v5", "pong"), ("PongNoFrameskip-v4", "pong"),
                                       ("SpaceInvaders", "space_invaders"), ("space_invaders", "space_invaders"),
                                       ("ALE/MontezumaRevenge-v5", "montezuma_revenge"), ("TicTacToe3D", "tic_tac_toe_3d"),
                                       ("NoSuchGame", None)])
def test_game_names_resolve_to_roms(name, rom):
    assert atari_rom(name) == rom


def test_unknown_game_is_a_config_error_listing_the_games():
    with pytest.raises(ConfigError, match="Breakout.*Pong"):
        check_atari_name("Pongg")


@pytest.mark.parametrize("name", ["Combat", "Joust", "MazeCraze", "Warlords", "warlords"])
def test_a_rom_with_only_a_multiplayer_mode_is_not_a_game(name):
    """ale_py ships these ROMs but registers no single-player env for them: A3C refuses them at the config check
    instead of failing in the emulator, and the off-policy engine does not route them to the Atari stack."""
    from shared.atari import is_atari

    assert atari_rom(name) is None and not is_atari(name)
    with pytest.raises(ConfigError, match=f"{name}.*not a single-player ALE game"):
        check_atari_name(name)


def test_standard_stack_shapes_and_dtype():
    env = AtariBatch(AtariSettings(name="Pong"), num_envs=3, seed=0)
    obs = env.reset()
    assert obs.shape == (3, 4, 84, 84) and obs.dtype == np.uint8 and env.num_actions == 6
    step = env.step(np.zeros(3, dtype=np.int64))
    assert step.obs.shape == (3, 4, 84, 84) and step.reward.dtype == np.float32 and step.done.dtype == bool
    env.close()


def test_stack_is_configurable():
    settings = AtariSettings(name="Pong", frame_stack=2, image_size=64, grayscale=False)
    env = AtariBatch(settings, num_envs=2, seed=0)
    assert env.reset().shape == (2, settings.channels, 64, 64) == (2, 6, 64, 64)
    env.close()


def _game_overs(step) -> np.ndarray:
    """Which of the step's games ended (its ``finished`` as a mask)."""
    return np.isin(np.arange(len(step.done)), [index for index, _, _ in step.finished])


def _play(settings, steps, seed=0):
    """``steps`` random actions in 2 games: per step the rewards, training dones and game overs, and the games that
    ended as ``(env, score, agent_steps)``."""
    env = AtariBatch(settings, num_envs=2, seed=seed)
    env.reset()
    rng = np.random.default_rng(seed)
    rewards, dones, overs, finished = [], [], [], []
    for _ in range(steps):
        step = env.step(rng.integers(0, env.num_actions, 2))
        rewards.append(step.reward)
        dones.append(step.done)
        overs.append(_game_overs(step))
        finished += step.finished
    env.close()
    return np.array(rewards), np.array(dones), np.array(overs), finished


def test_rewards_are_clipped_for_training_but_scores_stay_raw():
    # SpaceInvaders pays 5-30 points per alien: clipped training rewards are signs, the scores are raw sums
    rewards, _, _, finished = _play(AtariSettings(name="SpaceInvaders"), 700)
    assert set(np.unique(rewards)) <= {0.0, 1.0} and rewards.sum() > 0
    assert finished and all(score > 30 and float(score).is_integer() for _, score, _ in finished)


def test_episodic_life_ends_training_episodes_only():
    """Breakout has 5 lives: each lost life is a training `done` while the game (the reported episode) goes on, so a
    finished game is exactly 5 training episodes; without episodic life a training episode is the whole game. The
    same seed and actions play the same games either way: episodic life changes the signal, not the game."""
    _, dones, overs, finished = _play(AtariSettings(name="Breakout"), 400)
    _, dones_off, overs_off, _ = _play(AtariSettings(name="Breakout", episodic_life=False), 400)
    assert np.array_equal(overs_off, overs)
    assert np.array_equal(dones_off, overs)
    for env in range(2):
        ends = np.flatnonzero(overs[:, env])
        assert len(ends) >= 1
        for start, end in zip([0, *(ends[:-1] + 1)], ends):
            assert dones[start:end + 1, env].sum() == 5  # 4 lost lives, then the game over
        assert dones[ends[-1] + 1:, env].sum() <= 4  # the game still going at the end
    assert len(finished) == overs.sum()


def test_the_step_after_a_lost_life_runs_fire_and_reports_it():
    """After a lost life the env presses FIRE whatever was asked (Breakout relaunches the ball only on FIRE): that
    step reports ``fire_forced`` and FIRE as the action the game ran, every other step the action asked for. An agent
    that never presses FIRE still plays whole games, each ball relaunched."""
    fire = fire_action(atari_rom("Breakout"))
    env = AtariBatch(AtariSettings(name="Breakout"), num_envs=2, seed=0)
    env.reset()
    lost = np.zeros(2, dtype=bool)  # a life lost at the previous step, the game going on
    forced = games = 0
    try:
        for _ in range(300):
            step = env.step(np.zeros(2, dtype=np.int64))  # NOOP
            assert np.array_equal(step.fire_forced, lost)
            assert np.array_equal(step.action, np.where(lost, fire, 0))
            lost = step.terminated & ~_game_overs(step)
            forced, games = forced + step.fire_forced.sum(), games + len(step.finished)
    finally:
        env.close()
    assert forced >= 16 and games >= 4  # 2 envs x 2 games x 4 relaunches, whole games of an agent that never fires


def _offpolicy_breakout(steps, policy=None, seed=0):
    """The off-policy (torchrl) Breakout env, one game, for ``steps`` agent steps of random (or ``policy``) actions."""
    from shared.envs import make_env

    env = make_env("Breakout", seed=seed, num_envs=1, atari=AtariSettings(name="Breakout"), train=True)
    try:
        return env.rollout(steps, policy, break_when_any_done=False)
    finally:
        env.close()


def test_a_lost_life_ends_the_training_episode_but_not_the_game():
    """ALE's own episodic_life restarted the whole game at every lost life (lives stayed 5); here the game goes on:
    4 lost lives per finished 5-life game, the emulator's episode frame counter keeps running across them, and the
    replay sees each lost life as a terminal transition."""
    from offpolicy.collect.statistics import for_replay

    td = _offpolicy_breakout(1200)
    nxt = td["next"]
    lost, over = nxt["life_lost"].reshape(-1), nxt["game_over"].reshape(-1)
    assert over.sum() >= 2 and lost.sum() >= 4 * over.sum()
    lives = nxt["lives"].reshape(-1)
    assert set(lives[lost].tolist()) == {4, 3, 2, 1}  # the same game, one life fewer each time
    frames = nxt["episode_frame_number"].reshape(-1)
    t = int(lost.nonzero()[0])
    assert frames[t + 1] > frames[t - 1] > 0  # not a new game after the lost life
    assert not nxt["done"].reshape(-1)[lost].any()  # the env itself never resets for a lost life...
    replay = for_replay(td)
    assert replay["next", "terminated"].reshape(-1)[lost].all()  # ...the training signal ends there
    assert replay["next", "terminated"].sum() == (lost | over).sum()


def test_fire_after_a_lost_life_relaunches_the_ball():
    """A policy that never presses FIRE (always NOOP): in Breakout the ball comes back only on FIRE, so without the
    FIRE after each lost life the game would stall with 4 lives until the frame cap. The torchrl env reports what
    each step ran as ``("next", "executed_action")``: FIRE right after each lost life, the NOOP asked for otherwise."""
    from tensordict.nn import TensorDictModule

    noop = TensorDictModule(lambda obs: torch.nn.functional.one_hot(torch.zeros(obs.shape[:-3], dtype=torch.long), 4),
                            in_keys=["observation"], out_keys=["action"])
    from offpolicy.collect.statistics import for_replay

    td = _offpolicy_breakout(1500, noop)
    nxt = td["next"]
    assert nxt["game_over"].sum() >= 1 and nxt["life_lost"].sum() >= 4
    lost, executed = nxt["life_lost"].reshape(-1), nxt["executed_action"].reshape(-1)
    after_lost = torch.cat([torch.zeros(1, dtype=torch.bool), lost[:-1]])
    ran = torch.where(after_lost, fire_action(atari_rom("Breakout")), 0)
    assert torch.equal(executed, ran)
    assert (td["action"].reshape(-1, 4).argmax(-1) == 0).all()  # the policy asked for NOOP every time...
    assert torch.equal(for_replay(td)["action"].argmax(-1), ran)  # ...replay learns from what the game ran
