"""``python -m offpolicy.evaluate``: deterministic episodes of a saved policy, from the checkpoint alone."""
from __future__ import annotations

import json

import pytest
import torch
from offpolicy_helpers import train_inprocess

from offpolicy.algos import ALGOS
from offpolicy.checkpoint import FORMAT_VERSION
from offpolicy.evaluate import main


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dqn")
    s = train_inprocess("algo=dqn", "profile=smoke", "eval.final_episodes=0", f"run_dir={run_dir}")
    return run_dir, s


def test_evaluates_a_checkpoint_with_its_own_env_and_weights(checkpoint, capsys):
    run_dir, trained = checkpoint
    assert main([f"checkpoint={trained['checkpoint']}", "episodes=3", "seed=5"]) == 0
    result = json.loads((run_dir / "evaluation.json").read_text())
    assert result["episodes"] == 3 and len(result["returns"]) == len(result["lengths"]) == 3
    assert result["algo"] == "dqn" and result["env"] == "CartPole-v1"
    assert result["env_steps_trained"] == trained["env_steps"] == 300
    # CartPole pays 1 per step: every return equals its episode's length, and the mean is the returns' mean
    assert result["returns"] == [float(n) for n in result["lengths"]]
    assert result["return"] == pytest.approx(sum(result["returns"]) / 3)
    assert capsys.readouterr().out.startswith("return: ")
    # the same seed plays the same episodes with the same weights
    assert main([f"checkpoint={trained['checkpoint']}", "episodes=3", "seed=5"]) == 0
    assert json.loads((run_dir / "evaluation.json").read_text())["returns"] == result["returns"]


def test_the_policy_is_the_checkpoint_s(checkpoint, tmp_path):
    """With every Q value zeroed in the checkpoint the greedy policy always pushes left: CartPole falls within a few
    dozen steps, whatever the trained policy did."""
    _, trained = checkpoint
    state = torch.load(trained["checkpoint"], weights_only=True)
    state["learner"]["loss"] = {k: torch.zeros_like(v) for k, v in state["learner"]["loss"].items()}
    torch.save(state, tmp_path / "zeroed.pt")
    assert main([f"checkpoint={tmp_path / 'zeroed.pt'}", "episodes=2", f"run_dir={tmp_path}"]) == 0
    result = json.loads((tmp_path / "evaluation.json").read_text())
    assert max(result["returns"]) < 30


def test_a_checkpoint_of_format_version_0_evaluates_and_resumes(checkpoint, tmp_path):
    """A real checkpoint put back in format version 0 (no ``format_version``, env-step keys and counters named
    "frames", no ``env.kind`` or ``stop_return_reached``) evaluates with its weights and resumes its counters."""
    _, trained = checkpoint
    state = torch.load(trained["checkpoint"], weights_only=True)
    del state["format_version"], state["config"]["env"]["kind"], state["counters"]["stop_return_reached"]
    state["config"]["total_frames"] = state["config"].pop("total_env_steps")
    state["config"]["dqn"]["eps_anneal_frames"] = state["config"]["dqn"].pop("eps_anneal_env_steps")
    state["counters"]["collected_frames"] = state["counters"].pop("env_steps")
    (tmp_path / "checkpoints").mkdir()
    torch.save(state, tmp_path / "checkpoints" / "last.pt")
    assert main([f"checkpoint={tmp_path / 'checkpoints' / 'last.pt'}", "episodes=2", "seed=5"]) == 0
    result = json.loads((tmp_path / "evaluation.json").read_text())
    assert result["env_steps_trained"] == trained["env_steps"] == 300 and len(result["returns"]) == 2
    resumed = train_inprocess(f"resume={tmp_path / 'checkpoints' / 'last.pt'}", "total_env_steps=400")
    assert resumed["status"] == "completed" and resumed["env_steps"] == 400
    assert torch.load(tmp_path / "checkpoints" / "last.pt", weights_only=True)["format_version"] == FORMAT_VERSION


@pytest.mark.parametrize("args, message", [
    ([], "checkpoint is required"),
    (["checkpoint=/nonexistent/last.pt"], "checkpoint='/nonexistent/last.pt': no such file"),
    (["checkpoint=x.pt", "episodes=0"], "episodes=0"),
    (["checkpoint=x.pt", "nope=1"], "nope"),
])
def test_bad_arguments_are_one_error_line_and_exit_2(args, message, capsys):
    from shared.config import run_cli

    with pytest.raises(SystemExit) as exit_info:
        run_cli(main, args)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err


@pytest.mark.parametrize("algo", ALGOS)
def test_the_eval_policy_is_deterministic_whatever_the_exploration_type(algo):
    """tensordict keeps the exploration type process-wide and the learner's losses set RANDOM while the evaluator's
    thread plays: every algorithm's eval policy (the stochastic actors' deterministic sample, the greedy Q network,
    the deterministic actor without its noise) gives the DETERMINISTIC actions under any setting."""
    from offpolicy_helpers import smoke_parts
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    _, _, parts, batch = smoke_parts(algo)
    observations = batch[:16].select("observation")
    with torch.no_grad(), set_exploration_type(ExplorationType.DETERMINISTIC):
        expected = parts.collect_policy(observations.clone())["action"]
    for setting in (ExplorationType.RANDOM, None):
        with torch.no_grad(), set_exploration_type(setting):
            assert torch.equal(parts.eval_policy(observations.clone())["action"], expected)
    with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):  # the collection policy does sample
        assert not torch.equal(parts.collect_policy(observations.clone())["action"], expected)


@pytest.mark.parametrize("algo", ALGOS)
def test_the_eval_policy_on_tensors_acts_as_the_eval_policy(algo):
    """Every algorithm's evaluation policy on plain tensors (``AlgoParts.eval_tensor_policy``, as its module declares
    it: what ``offpolicy.export`` writes) gives its TensorDict path's actions on the same observations (a discrete
    action as the index of the one-hot one), also after the weights change: it shares the policy's networks, so a
    checkpoint's weights loaded into the loss reach it."""
    from offpolicy_helpers import smoke_parts
    from tensordict import TensorDict

    from offpolicy.algos import algorithm

    _, _, parts, batch = smoke_parts(algo)
    seen = batch[:32].get("observation")
    torch.manual_seed(0)  # and observations off the few states a smoke batch visits, where actions differ more
    observations = TensorDict(observation=torch.cat([seen, 3 * torch.randn_like(seen)]), batch_size=[64])
    played = []
    for _ in range(2):
        with torch.no_grad():
            expected = parts.eval_policy(observations.clone())["action"]
            actions = parts.eval_tensor_policy(observations["observation"])
        if algorithm(algo).discrete:
            assert actions.dtype == torch.int64 and actions.shape == expected.shape[:-1]
            expected = expected.argmax(-1)
        torch.testing.assert_close(actions, expected)
        played.append(actions)
        with torch.no_grad():  # new weights, as a checkpoint loads them: into the loss
            for p in parts.loss.parameters():
                p.add_(torch.randn_like(p))
    assert not torch.equal(*played)


def test_playing_episodes_leaves_the_process_wide_exploration_type_alone():
    """The evaluator thread's episodes must not set tensordict's process-wide exploration type, not even for the time
    of a call (torchrl's ``get_dist`` does): the training thread would see it (a compiled learner step recompiled on
    it). The type is recorded around the eval policy's calls and inside its network's forward."""
    from offpolicy_helpers import smoke_parts
    from tensordict.nn import TensorDictModuleBase
    from torchrl.envs.utils import exploration_type

    from offpolicy.envs import make_eval_env
    from offpolicy.evaluate import play_episodes

    cfg, _, parts, _ = smoke_parts("sac")
    seen = []

    class Recording(TensorDictModuleBase):
        in_keys, out_keys = parts.eval_policy.in_keys, parts.eval_policy.out_keys

        def forward(self, tensordict):
            seen.append(exploration_type())
            tensordict = parts.eval_policy(tensordict)
            seen.append(exploration_type())
            return tensordict

    network = parts.eval_policy.actor.module[0].module
    hook = network.register_forward_pre_hook(lambda module, args: seen.append(exploration_type()))
    try:
        returns, lengths, _ = play_episodes(make_eval_env(cfg), Recording(), episodes=1, max_steps=20)
    finally:
        hook.remove()
    assert lengths == [20] and len(seen) == 60 and set(seen) == {None}


def test_the_learner_keeps_cfg_threads_while_the_evaluator_runs(monkeypatch, tmp_path):
    """The background evaluator sets one torch thread for itself; torch keeps that setting per thread here, so every
    learner step of a ``threads=2`` run still runs on 2 threads, also the steps after an evaluation."""
    import torch
    from offpolicy_helpers import train_inprocess

    import offpolicy.evaluate
    from offpolicy.learner import Learner

    learner_threads, evaluator_threads, evaluations = [], [], []
    update, play = Learner.update, offpolicy.evaluate.play_episodes

    def recording_update(self, *args, **kwargs):
        learner_threads.append((len(evaluations), torch.get_num_threads()))
        return update(self, *args, **kwargs)

    def recording_play(*args, **kwargs):  # what the background evaluator calls for each evaluation
        evaluator_threads.append(torch.get_num_threads())
        played = play(*args, **kwargs)
        evaluations.append(1)
        return played

    monkeypatch.setattr(Learner, "update", recording_update)
    monkeypatch.setattr(offpolicy.evaluate, "play_episodes", recording_play)
    before = torch.get_num_threads()
    try:
        s = train_inprocess("algo=dqn", "env=CartPole-v1", "profile=smoke", "threads=2", "total_env_steps=500",
                            "eval.interval_env_steps=100", "eval.final_episodes=0", f"run_dir={tmp_path}")
    finally:
        torch.set_num_threads(before)
    assert s["status"] == "completed"
    assert evaluator_threads and set(evaluator_threads) == {1}
    assert learner_threads and {threads for _, threads in learner_threads} == {2}
    assert max(done for done, _ in learner_threads) >= 1  # some learner steps came after a finished evaluation


def test_a_run_stops_once_a_periodic_evaluation_reaches_stop_return(tmp_path):
    """``eval.stop_return``: the first periodic evaluation at or above it stops training after the round in which it
    finished; the final evaluation still runs and the summary says where the run stopped. (CartPole returns >= 8,
    so 5 is reached by the first evaluation; 1e9 never is.)"""
    s = train_inprocess("algo=dqn", "profile=smoke", "total_env_steps=200000", "eval.interval_env_steps=100",
                        "eval.stop_return=5", f"run_dir={tmp_path}")
    reached = s["stop_return_reached"]
    assert s["status"] == "completed" and reached["return"] >= 5
    assert reached["eval_env_steps"] == 100  # the first evaluation
    assert reached["eval_env_steps"] <= reached["stopped_at_env_steps"] == s["env_steps"] < 200000
    assert (tmp_path / "summary.json").exists() and s["eval_return_last"] is not None  # the final evaluation ran
    s = train_inprocess("algo=dqn", "profile=smoke", "eval.interval_env_steps=100", "eval.stop_return=1e9",
                        f"run_dir={tmp_path / 'never'}")
    assert s["stop_return_reached"] is None and s["env_steps"] == 300 and s["status"] == "completed"


def test_stop_return_takes_a_number_or_null():
    from offpolicy.train import compose_config
    from shared.config import ConfigError

    assert compose_config(["algo=dqn", "eval.stop_return=15"])[0].eval.stop_return == 15
    with pytest.raises(ConfigError, match="eval.stop_return"):
        compose_config(["algo=dqn", "eval.stop_return=high"])


@pytest.mark.parametrize("when", ["last_round", "final"])
def test_an_evaluation_finished_after_the_last_round_still_counts_for_stop_return(tmp_path, when):
    """The evaluation submitted in the last round (``last_round``: every 300 env steps of a 300-step run) or the
    final one finishes after the loop ended: its return still records ``stop_return_reached`` (it was lost before)."""
    periodic = ["eval.interval_env_steps=300", "eval.final_episodes=0"] if when == "last_round" else \
        ["eval.interval_env_steps=0", "eval.final_episodes=1"]
    s = train_inprocess("algo=dqn", "profile=smoke", *periodic, "eval.stop_return=5", f"run_dir={tmp_path}")
    reached = s["stop_return_reached"]
    assert s["status"] == "completed" and s["env_steps"] == 300
    assert reached is not None and reached["return"] == s["eval_return_last"] >= 5
    assert reached["eval_env_steps"] == reached["stopped_at_env_steps"] == 300


def test_a_resumed_run_remembers_the_reached_stop_return(tmp_path):
    """``stop_return_reached`` is a counter: a run resumed after it stopped at the target keeps the first run's
    record (the evaluation at 100 env steps) and trains on to its new total instead of stopping again."""
    first = train_inprocess("algo=dqn", "profile=smoke", "total_env_steps=200000", "eval.interval_env_steps=100",
                            "eval.stop_return=5", f"run_dir={tmp_path / 'first'}")
    assert first["stop_return_reached"]["eval_env_steps"] == 100 and first["env_steps"] < 1000
    resumed = train_inprocess(f"resume={first['checkpoint']}", "total_env_steps=1000",
                              f"run_dir={tmp_path / 'resumed'}")
    assert resumed["stop_return_reached"] == first["stop_return_reached"]
    assert resumed["status"] == "completed" and resumed["env_steps"] == 1000
