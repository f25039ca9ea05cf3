"""n-step returns (``loss.n_steps``), the dueling Q head (``dqn.dueling``) and the Atari replay that stores each frame
once (``replay.frames_once``): hand-computed n-step targets at every cut, stacks rebuilt from stored frames equal to
the stacks the env produced (episode starts, lost lives, game overs, batch boundaries, the ring's wrap, a restarted
stream), checkpoints, bad values."""
from __future__ import annotations

import io
import math

import pytest
import torch
from offpolicy_helpers import run_cli, summary, train_inprocess, window_length
from tensordict import TensorDict

from offpolicy.algos import ALGOS, algorithm
from offpolicy.builder import Builder
from offpolicy.collect.statistics import for_replay
from offpolicy.config import compose_config
from offpolicy.envs import make_train_env
from offpolicy.replay.frames import FrameReplay
from offpolicy.replay.nstep import n_step_transitions
from offpolicy.tools.plan import make_plan
from shared.config import ConfigError


def _rollout(T=10, terminated=(), truncated=(), life_lost=()):
    """One env's T steps: observation t, next observation t + 1 (100 + t where the step ended), reward t + 1."""
    ended = torch.zeros(1, T, 1, dtype=torch.bool)
    term, trunc, lost = ended.clone(), ended.clone(), torch.zeros(1, T, dtype=torch.bool)
    for t in terminated:
        term[0, t] = True
    for t in truncated:
        trunc[0, t] = True
    for t in life_lost:
        lost[0, t] = True
    time = torch.arange(T, dtype=torch.float32).view(1, T, 1)
    next_obs = torch.where(term | trunc, 100 + time, time + 1)
    return TensorDict({"observation": time, "action": torch.zeros(1, T, 2),
                       "next": {"observation": next_obs, "reward": time + 1, "terminated": term, "truncated": trunc,
                                "done": term | trunc, "life_lost": lost}}, batch_size=[1, T])


def test_n_step_targets_stop_at_termination_truncation_lost_life_and_batch_end():
    gamma, r = 0.5, lambda t: t + 1.0
    # terminated at 3, truncated at 6, a lost life at 8 (for_replay ends the training episode there), batch ends at 9
    batch = for_replay(_rollout(terminated=[3], truncated=[6], life_lost=[8])).reshape(1, -1)
    out = n_step_transitions(batch, n=3, gamma=gamma)
    expected = {  # t: (steps k, last step of the window)
        0: (3, 2), 1: (3, 3), 2: (2, 3), 3: (1, 3), 4: (3, 6), 5: (2, 6), 6: (1, 6), 7: (2, 8), 8: (1, 8), 9: (1, 9)}
    for t, (k, last) in expected.items():
        assert int(out["steps_to_next_obs"][0, t]) == k, t
        assert float(out["next", "reward"][0, t]) == pytest.approx(sum(gamma ** i * r(t + i) for i in range(k))), t
        assert float(out["next", "observation"][0, t]) == float(batch["next", "observation"][0, last]), t
        for key in ("done", "terminated", "truncated"):
            assert bool(out["next", key][0, t]) == bool(batch["next", key][0, last]), (t, key)
        assert float(out["observation"][0, t]) == t  # the root entries stay step t's
    one = n_step_transitions(batch, n=1, gamma=gamma)
    assert torch.equal(one["next", "reward"], batch["next", "reward"]) and one["steps_to_next_obs"].eq(1).all()


def test_n_step_windows_stay_within_their_env():
    """Two envs ending at different steps: each row's windows read only that env's steps."""
    a = for_replay(_rollout(terminated=[3], truncated=[6], life_lost=[8]))
    b = for_replay(_rollout(terminated=[1]))
    b.set(("next", "reward"), b["next", "reward"] * 10)  # env 1 earns 10 (t + 1)
    pair = torch.cat([a.reshape(1, -1), b.reshape(1, -1)], 0)
    out = n_step_transitions(pair, n=3, gamma=0.5)
    for row, single in enumerate((a, b)):
        alone = n_step_transitions(single.reshape(1, -1), n=3, gamma=0.5)
        assert (out[row : row + 1] == alone).all()
    assert out["steps_to_next_obs"][1, :3].flatten().tolist() == [2, 1, 3]  # env 1 terminated at step 1
    assert out["next", "reward"][1, 0].item() == pytest.approx(10 + 0.5 * 20)
    assert out["next", "reward"][0, 0].item() == pytest.approx(1 + 0.5 * 2 + 0.25 * 3)


def test_value_target_discounts_the_bootstrap_by_gamma_to_the_k():
    """torchrl's TD(0) estimator reads steps_to_next_obs: target = R + gamma^k (1 - terminated) V(next)."""
    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke", "loss.n_steps=3", "loss.gamma=0.9"])
    env = make_train_env(cfg)
    try:
        parts = Builder(cfg).parts(env)
    finally:
        env.close()
    td = TensorDict({"steps_to_next_obs": torch.tensor([[1], [2], [3], [3]]),
                     "next": {"reward": torch.tensor([[1.0], [2.0], [3.0], [4.0]]),
                              "done": torch.tensor([[False], [False], [False], [True]]),
                              "terminated": torch.tensor([[False], [False], [False], [True]])}}, batch_size=[4])
    target = parts.loss.value_estimator.value_estimate(td, next_value=torch.full((4, 1), 10.0))
    assert torch.allclose(target.flatten(), torch.tensor([1 + 9.0, 2 + 8.1, 3 + 7.29, 4.0]))


@pytest.mark.parametrize("algo", ALGOS)
def test_every_algorithm_trains_on_n_step_transitions(algo, tmp_path):
    """The replay writes 3-step transitions for every algorithm: the sampled windows are 3 long but where an episode
    or a batch ended (CartPole episodes end often, Pendulum's only at its 200-step limit)."""
    from shared.logging import read_scalars

    result = train_inprocess(f"algo={algo}", f"env={algorithm(algo).smoke_env}", "profile=smoke", "loss.n_steps=3",
                             *(["optim.utd_ratio=1"] if algo == "redq" else []), f"run_dir={tmp_path}")
    assert result["status"] == "completed" and result["optim_steps"] > 0
    _, windows = read_scalars(tmp_path, "replay/steps_to_next_obs")
    assert windows and all(1 < k <= 3 for k in windows), windows


@pytest.mark.parametrize("value", ["0", "-2", "2.5", "three"])
def test_bad_n_steps_is_one_error_line(value):
    with pytest.raises(ConfigError, match="loss.n_steps"):
        compose_config(["algo=dqn", "profile=smoke", f"loss.n_steps={value}"])


def test_bad_n_steps_exits_2_without_traceback():
    result = run_cli("algo=dqn", "profile=smoke", "loss.n_steps=0")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error:")] == [
        line for line in result.stderr.splitlines() if line.strip()]
    assert "loss.n_steps=0" in result.stderr


@pytest.mark.parametrize("overrides,key", [
    (["loss.n_steps=3", "loss.value_estimator=tdlambda", "replay.slice_len=8"], "loss.n_steps"),
    (["replay.frames_once=true"], "env.name"),  # CartPole has no frames
    (["env=Pong", "replay.frames_once=true", "replay.prioritized=true"], "replay.prioritized"),
    (["env=Pong", "replay.frames_once=true", "replay.storage=memmap"], "replay.storage"),
    (["env=Pong", "replay.frames_once=true", "engine=ray"], "engine"),
    (["env=Pong", "replay.frames_once=true", "replay.size=150", "collector.prefill_env_steps=100"], "replay.size"),
    (["loss.n_steps=300"], "loss.n_steps"),  # more than a uint8 window length
    (["loss.n_steps=5", "env.num_envs=2", "collector.env_steps_per_batch=8"], "loss.n_steps"),  # 4 steps per env
])
def test_n_step_and_frames_once_refuse_what_they_do_not_support(overrides, key):
    with pytest.raises(ConfigError, match=key):
        compose_config(["algo=dqn", "profile=smoke", *overrides])


# --- frames stored once: real Breakout data (lives, short random games) ---------------------------------------------

ENVS, STEPS, BATCHES = 2, 50, 16  # 800 steps per env: several lost lives and game overs under random actions


@pytest.fixture(scope="module")
def breakout_batches():
    """16 collected batches of 2 Breakout envs (random actions), flattened by ``for_replay``; each stamped with its
    batch index as policy version. The collector is replaced after batch 8 (new seed): the stream restarts there, as
    in a resumed run."""
    batches = []
    for part, seed in ((0, 0), (1, 7)):
        cfg, _ = compose_config(["algo=dqn", "profile=atari", "env=Breakout", f"env.num_envs={ENVS}",
                                 f"collector.env_steps_per_batch={ENVS * STEPS}", f"seed={seed}"])
        env = make_train_env(cfg)
        parts = Builder(cfg).parts(env)
        collector = Builder(cfg).collector(env, parts.collect_policy)
        try:
            for i, batch in zip(range(BATCHES // 2), collector):
                batch = for_replay(batch)
                batch.set(("next", "policy_version"), torch.full_like(batch["next", "policy_version"],
                                                                       part * BATCHES // 2 + i))
                batches.append(batch)
        finally:
            collector.shutdown()
    return batches


def _key(obs, next_obs) -> bytes:
    return obs.numpy().tobytes() + next_obs.numpy().tobytes()


def _env_transitions(batches, n: int, gamma: float) -> dict[bytes, set]:
    """What the env produced, as n-step transitions counted by hand (not with the n-step code the replay uses):
    (observation, next observation of the window's last step) -> the fields."""
    table: dict[bytes, set] = {}
    for batch in batches:
        rows = batch.reshape(ENVS, -1)
        for env in range(ENVS):
            nxt = rows[env]["next"]
            ended = nxt["done"].reshape(-1).tolist()
            reward = nxt["reward"].reshape(-1).tolist()
            flags = [nxt[key].reshape(-1).tolist() for key in ("terminated", "truncated", "done")]
            actions = rows[env]["action"].argmax(-1).tolist()
            for t in range(len(ended)):
                k = window_length(ended, t, n)
                last = t + k - 1
                fields = (actions[t], round(sum(gamma ** i * reward[t + i] for i in range(k)), 4), k,
                          *(bool(flag[last]) for flag in flags))
                key = _key(rows[env]["observation"][t], nxt["observation"][last])
                table.setdefault(key, set()).add(fields)
    return table


@pytest.mark.parametrize("n,size", [(1, 600), (3, 600), (3, 2000)])
def test_sampled_stacks_equal_the_env_stacks(breakout_batches, n, size):
    """600: 300 transitions per env, the ring wraps about twice; 2000: all kept, with the restarted stream."""
    replay = FrameReplay(size, ENVS, 4, n_steps=n, gamma=0.99, generator=torch.Generator().manual_seed(0))
    for batch in breakout_batches:
        replay.extend(batch)
    assert replay.write_count == ENVS * STEPS * BATCHES
    held = min(size, ENVS * STEPS * BATCHES)
    assert held <= len(replay) <= held + 20  # the ring's margin covers final frames: a prefill of replay.size is reached
    table = _env_transitions(breakout_batches, n, 0.99)
    sample = replay.sample(4000)
    assert sample["observation"].shape == (4000, 4, 84, 84) and sample["observation"].dtype == torch.uint8
    assert sample["action"].shape == (4000, breakout_batches[0]["action"].shape[-1])
    for i in range(len(sample)):
        s = sample[i]
        fields = (int(s["action"].argmax()), round(float(s["next", "reward"]), 4), int(s["steps_to_next_obs"]),
                  *(bool(s["next", k]) for k in ("terminated", "truncated", "done")))
        assert fields in table.get(_key(s["observation"], s["next", "observation"]), set()), i
    # the samples cover the hard cases: episode starts (zero frames), ends (game over and lost life), short windows
    assert (sample["observation"][:, 0].flatten(1).amax(1) == 0).any()
    assert sample["next", "terminated"].any() and sample["next", "done"].sum() > sample["next", "truncated"].sum()
    if n > 1:
        assert (sample["steps_to_next_obs"] < n).any() and (sample["steps_to_next_obs"] == n).any()
    versions = sample["next", "policy_version"]
    if size == 600:  # only what the ring still holds: ~6 of 16 batches
        assert int(versions.max()) == BATCHES - 1 and int(versions.min()) >= BATCHES - 8
    else:  # all, with the last transitions before the restart (their next frame kept as a final frame)
        assert int(versions.min()) == 0 and (versions == BATCHES // 2 - 1).any()


# --- frames stored once: a hand-made stream, every frame known, stacks by plain indexing ---------------------------

# per env, its games in order: (steps, how the last one ends); "cut": the stream restarts after it without a done
# flag (a resumed run resets its envs at a batch's start), or the data ends. Batches of 10 steps, 60 steps per env.
GAMES = ([(5, "terminated"), (7, "truncated"), (18, "terminated"), (10, "cut"), (20, "cut")],
         [(1, "terminated"), (1, "truncated"), (8, "terminated"), (30, "truncated"), (20, "cut")])
LIVES_LOST = ({2, 8, 38, 45}, {19, 20})  # steps (of each env's stream) where a life is lost and the game goes on
SPAN, PARTS = 10, 6


def _frame(env: int, game: int, j: int) -> torch.Tensor:
    """Frame ``j`` of a game (``j = length``: the frame after its last step), a 1x3 grey image unique in the run."""
    return torch.tensor([[env + 1, game + 1, j + 1]], dtype=torch.uint8)


def _stack(env: int, game: int, j: int) -> torch.Tensor:
    """The 4 frames up to frame ``j`` of a game, oldest first, zero before its first frame."""
    return torch.stack([_frame(env, game, i) if i >= 0 else torch.zeros(1, 3, dtype=torch.uint8)
                        for i in range(j - 3, j + 1)])


def _stream(env: int) -> list[dict]:
    """The env's steps in order: observation and next observation stacks, reward, action, end flags."""
    steps = []
    for game, (length, end) in enumerate(GAMES[env]):
        for j in range(length):
            s, last = len(steps), j == length - 1
            steps.append({"obs": _stack(env, game, j), "next": _stack(env, game, j + 1), "reward": s + 1.0 + 100 * env,
                          "action": (7 * s + env) % 3, "terminated": last and end == "terminated",
                          "truncated": last and end == "truncated", "lost": s in LIVES_LOST[env], "first": j == 0})
    assert len(steps) == SPAN * PARTS
    return steps


def _hand_batches() -> list:
    """The streams as collected batches (``[2, 10]``, stamped with their index as policy version), through
    ``for_replay`` as the engine writes them."""
    streams = [_stream(env) for env in range(2)]
    batches = []
    for part in range(PARTS):
        rows = [steps[part * SPAN:(part + 1) * SPAN] for steps in streams]

        def column(key, dtype=None):
            return torch.tensor([[step[key] for step in row] for row in rows], dtype=dtype).unsqueeze(-1)

        term, trunc = column("terminated"), column("truncated")
        batch = TensorDict({
            "observation": torch.stack([torch.stack([step["obs"] for step in row]) for row in rows]),
            "action": torch.nn.functional.one_hot(column("action").squeeze(-1), 3), "is_init": column("first"),
            "next": {"observation": torch.stack([torch.stack([step["next"] for step in row]) for row in rows]),
                     "reward": column("reward", torch.float32), "terminated": term, "truncated": trunc,
                     "done": term | trunc, "life_lost": column("lost").squeeze(-1),
                     "policy_version": torch.full((2, SPAN), part)},
        }, batch_size=[2, SPAN])
        batches.append(for_replay(batch))
    return batches


def _hand_transitions(n: int, gamma: float) -> dict[bytes, tuple]:
    """Every n-step transition of the streams, by plain indexing: (observation, next observation) -> its fields.
    A window stops after an ended step (a lost life too: it ends the training episode) and at its batch's end."""
    table = {}
    for env in range(2):
        steps = _stream(env)
        for part in range(PARTS):
            span = steps[part * SPAN:(part + 1) * SPAN]
            ended = [st["terminated"] or st["truncated"] or st["lost"] for st in span]
            for t, step in enumerate(span):
                k = window_length(ended, t, n)
                last = span[t + k - 1]
                term = last["terminated"] or last["lost"]
                table[_key(step["obs"], last["next"])] = (
                    step["action"], sum(gamma ** i * span[t + i]["reward"] for i in range(k)), k, term,
                    last["truncated"], term or last["truncated"], part)
    return table


@pytest.mark.parametrize("n,size", [(1, 1000), (3, 1000), (3, 40)])
def test_sampled_stacks_equal_hand_made_stacks(n, size):
    """1000: every transition held, and sampling finds each of them, nothing else; 40: the ring wraps and holds the
    newest. Episode starts zero the frames before them (no frame of the previous game leaks in), lost lives do not
    break the stack, game overs and truncations keep their final frame, a cut stream keeps its provisional one."""
    replay = FrameReplay(size, 2, 4, n_steps=n, gamma=0.5, generator=torch.Generator().manual_seed(0))
    for batch in _hand_batches():
        replay.extend(batch)
    table = _hand_transitions(n, 0.5)
    assert len(table) == 2 * SPAN * PARTS
    sample = replay.sample(3000)
    seen = set()
    for i in range(len(sample)):
        s = sample[i]
        key = _key(s["observation"], s["next", "observation"])
        assert key in table, i
        action, reward, k, term, trunc, done, version = table[key]
        assert (int(s["action"].argmax()), int(s["steps_to_next_obs"])) == (action, k), i
        assert float(s["next", "reward"]) == pytest.approx(reward), i
        assert [bool(s["next", f]) for f in ("terminated", "truncated", "done")] == [term, trunc, done], i
        assert int(s["next", "policy_version"]) == version, i
        seen.add(key)
    if size >= 2 * SPAN * PARTS:
        assert seen == set(table) and len(replay) == len(table)
    else:  # the ring keeps about the newest 20 steps of each env: the last two batches
        assert len(replay) >= size and {table[key][-1] for key in seen} == {PARTS - 2, PARTS - 1}


def test_frame_replay_state_round_trips_through_a_safe_load(breakout_batches):
    replay = FrameReplay(1000, ENVS, 4, n_steps=3)
    for batch in breakout_batches[:5]:
        replay.extend(batch)
    buffer = io.BytesIO()
    torch.save(replay.state_dict(), buffer)
    buffer.seek(0)
    restored = FrameReplay(1000, ENVS, 4, n_steps=3)
    restored.load_state_dict(torch.load(buffer, weights_only=True))
    assert len(restored) == len(replay) and restored.write_count == replay.write_count
    replay.generator, restored.generator = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert (replay.sample(64) == restored.sample(64)).all()
    for batch in breakout_batches[5:7]:  # both go on identically
        replay.extend(batch)
        restored.extend(batch)
    assert (replay.data == restored.data).all()
    with pytest.raises(ValueError, match="slots"):
        FrameReplay(2000, ENVS, 4).load_state_dict(replay.state_dict())


@pytest.mark.parametrize("size,envs", [(100, 2), (1000, 4)])
def test_atari_plan_bytes_per_transition_is_what_the_frame_replay_allocates(breakout_batches, size, envs):
    """The plan's bytes per transition with frames stored once against the tensors the run's frame replay allocates
    on its first write of real Breakout steps (2 envs' batch, or each env's half as one of 4): every slot's frame and
    fields, over ``replay.size``."""
    cfg, _ = compose_config(["algo=dqn", "profile=atari", "env=Breakout", f"env.num_envs={envs}",
                             f"collector.env_steps_per_batch={10 * envs}", f"collector.prefill_env_steps={size}",
                             f"replay.size={size}"])
    replay = Builder(cfg).replay()
    assert isinstance(replay, FrameReplay)
    replay.extend(breakout_batches[0])
    allocated = sum(t.nbytes for t in replay.data.values(True, True))
    assert allocated >= size * (84 * 84 + 16)  # a grey frame and 16 B of fields for each of size transitions at least
    assert make_plan(cfg)["bytes_per_transition"] == math.ceil(allocated / size)


def test_atari_frames_once_stores_an_eighth_of_two_stacks():
    frames_once = make_plan(compose_config(["algo=dqn", "profile=atari"])[0])["bytes_per_transition"]
    stacks = make_plan(compose_config(["algo=dqn", "profile=atari", "replay.frames_once=false"])[0])[
        "bytes_per_transition"]
    assert 84 * 84 + 16 < frames_once <= 8192 and stacks > 2 * 4 * 84 * 84


def test_atari_frames_once_resumes_with_its_replay(tmp_path):
    common = ["algo=dqn", "profile=atari", "env=Breakout", "env.num_envs=2", "collector.env_steps_per_batch=100",
              "collector.prefill_env_steps=200", "replay.size=1000", "replay.in_checkpoint=true",
              "eval.interval_env_steps=0", "eval.final_episodes=0", "logger.progress_bar=false", "threads=1"]
    first = train_inprocess(*common, "total_env_steps=300", f"run_dir={tmp_path / 'a'}")
    assert first["status"] == "completed" and first["replay_writes"] == 300
    resumed = train_inprocess(*common, "total_env_steps=500", f"resume={first['checkpoint']}",
                              f"run_dir={tmp_path / 'b'}")
    assert resumed["replay_writes"] == 500 and resumed["env_steps"] == 500
    assert resumed["optim_steps"] == first["optim_steps"] + 20  # two rounds of 10 updates, replay already full enough
    assert summary(tmp_path / "b")["status"] == "completed"
    # what the saved replay was written with cannot change on resume
    for change in ("loss.n_steps=1", "replay.size=2000", "replay.frames_once=false"):
        with pytest.raises(ConfigError, match=change.split("=")[0]):
            compose_config([*common, f"resume={first['checkpoint']}", change])
    # a checkpoint from before these keys existed (format version 0) resumes with what it ran with, not today's
    # profile values
    old = torch.load(first["checkpoint"], weights_only=True)
    old["replay"] = None
    del old["format_version"]
    for section, key in (("loss", "n_steps"), ("replay", "frames_once"), ("dqn", "dueling")):
        del old["config"][section][key]
    torch.save(old, tmp_path / "old.pt")
    cfg, _ = compose_config([f"resume={tmp_path / 'old.pt'}"])
    assert (cfg.profile, cfg.loss.n_steps, cfg.replay.frames_once, cfg.dqn.dueling) == ("atari", 1, False, False)


def test_plan_measures_the_atari_profile():
    """``offpolicy.tools.plan`` times the run's own parts: n-step writes and the frame replay included."""
    from offpolicy.tools.rates import measure

    cfg, _ = compose_config(["algo=dqn", "profile=atari", "env=Breakout", "env.num_envs=4",
                             "collector.env_steps_per_batch=60", "collector.prefill_env_steps=60"])
    rates = measure(cfg)
    assert rates.replay_write_s > 0 and 0 < rates.update_s < 5 and rates.update_batch == 32


# --- dueling head ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env_name,hidden", [("CartPole-v1", "[64,32]"), ("CartPole-v1", "[16]"), ("Pong", "[512]")])
def test_dueling_q_is_value_plus_centred_advantage(env_name, hidden):
    cfg, _ = compose_config(["algo=dqn", "profile=smoke", f"env={env_name}", "dqn.dueling=true",
                             f"model.hidden={hidden}"])
    env = make_train_env(cfg)
    try:
        parts = Builder(cfg).parts(env)
        obs = env.reset()["observation"]
    finally:
        env.close()
    net = parts.eval_policy.module[0].module  # QValueActor -> its Q network
    *body, head = net
    features = torch.nn.Sequential(*body)(obs)
    value, advantage = head.value(features), head.advantage(features)
    q = net(obs)
    assert q.shape[-1] == env.action_spec_unbatched.shape[-1] and value.shape[-1] == 1
    assert torch.allclose(q.mean(-1, keepdim=True), value, atol=1e-5)  # mean over actions of A - mean(A) is 0
    assert torch.allclose(q - value, advantage - advantage.mean(-1, keepdim=True), atol=1e-5)
    q[..., 0].sum().backward()  # both streams get gradients (the sum over all actions leaves A out)
    for stream in (head.value, head.advantage):
        assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in stream.parameters())


def test_channels_last_trunk_computes_the_same_q_values():
    from shared.models import AtariTrunk

    torch.manual_seed(0)
    plain = AtariTrunk(4, 84, "nature")
    fast = AtariTrunk(4, 84, "nature", channels_last=True)
    fast.load_state_dict(plain.state_dict())
    frames = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    assert fast.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(fast(frames), plain(frames), atol=1e-5)
