"""C51 (offpolicy/algos/c51.py): its config checks, its policies' forms against torchrl's distributional actor, the
loss's projected target on a case worked by hand, and runs on the Atari frame replay and the Ray engine. (The tests
run over every algorithm cover it too: smoke runs, evaluation, export in both formats, n-step returns, compile.)"""
from __future__ import annotations

import math

import pytest
import torch
from offpolicy_helpers import run_cli, smoke_parts, summary
from proc import wait_no_ray
from tensordict import TensorDict

from offpolicy.algos.c51 import GreedyMeanQ, MeanQ
from offpolicy.config import compose_config
from shared.checkpoint import load_checkpoint
from shared.config import ConfigError


@pytest.mark.parametrize("override, message", [
    (["c51.v_min=5", "c51.v_max=5"], "c51.v_min=5.0 is not allowed; allowed: below c51.v_max=5.0"),
    (["loss.value_estimator=td1", "replay.slice_len=8"],
     "loss.value_estimator=td1 is not allowed for c51; allowed: td0"),
    (["loss.function=smooth_l1"], "loss.function=smooth_l1 is not allowed for c51; allowed: l2"),
    (["c51.atoms=1"], "c51.atoms=1 is out of range; allowed: an integer >= 2"),
    (["dqn.double=true"], "unknown key 'dqn.double'"),
    (["compile.enabled=true"], "compile.enabled=true is not allowed for c51; allowed: auto or false"),
])
def test_c51_config_is_checked_with_one_line(override, message):
    with pytest.raises(ConfigError) as error:
        compose_config(["algo=c51", "profile=smoke", *override])
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_auto_compile_stays_eager_and_priorities_are_the_loss():
    """torchrl's distributional loss does not run under torch.compile: a run long enough for ``auto`` stays eager
    and says why; the replay's priority of a sample is its cross-entropy (below), as Rainbow prioritises."""
    from offpolicy.algos import algorithm
    from offpolicy.compiling import compile_choice

    cfg, _ = compose_config(["algo=c51", "total_env_steps=10000000"])
    assert compile_choice(cfg) == compile_choice(cfg).__class__(False, "c51's loss does not run under torch.compile")
    assert algorithm("c51").priority == "loss"


def test_the_policies_act_on_the_mean_of_the_return_distributions():
    """The evaluation policy's tensor form and the lean collector's greedy steps take the argmax of each action's mean
    return, as torchrl's ``DistributionalQValueActor`` does; not the argmax over the network's raw atoms."""
    _, _, parts, batch = smoke_parts("c51")
    observation = batch["observation"][:64]
    with torch.no_grad():
        td_action = parts.eval_policy(TensorDict({"observation": observation}, [64]))["action"].argmax(-1)
        logits = parts.eval_policy.module[0].module(observation)  # [n, atoms, A]
        mean = (logits.softmax(-2) * parts.eval_policy.support.unsqueeze(-1)).sum(-2)
        assert torch.allclose(MeanQ(parts.eval_policy)(observation), mean)
        assert torch.equal(parts.eval_tensor_policy(observation), td_action)
        assert torch.equal(td_action, mean.argmax(-1))
        # the collection policy without exploration: the same greedy action, one-hot, on the lean path
        parts.exploration.eps.fill_(0.0)
        assert torch.equal(parts.collect_policy.act(observation).argmax(-1), td_action)
        draws = parts.collect_policy.draw(1, 64)
        assert torch.equal(torch.as_tensor(parts.collect_policy.act_index(observation, draws, 0)), td_action)
    assert isinstance(parts.eval_tensor_policy, GreedyMeanQ)


def test_the_loss_is_the_cross_entropy_to_the_projected_target():
    """A terminal transition whose reward lies on a support atom has a one-atom target: the loss of each sample is
    ``-log p(s, a)[atom of r]``, and its priority (that loss, ``[B]``) is written for the replay."""
    cfg, _, parts, batch = smoke_parts("c51", "c51.atoms=11", "c51.v_min=0", "c51.v_max=10")
    sample = batch[:8].clone()
    reward = torch.tensor([0.0, 1, 2, 3, 4, 5, 7, 10]).unsqueeze(-1)
    sample.set(("next", "reward"), reward)
    for name in ("done", "terminated"):
        sample.set(("next", name), torch.ones(8, 1, dtype=torch.bool))
    loss = parts.loss(sample)["loss"]
    with torch.no_grad():
        log_p = parts.eval_policy.module[0].module(sample["observation"]).log_softmax(-2)  # [B, atoms, A]
        action = sample["action"].argmax(-1)
        expected = -log_p[torch.arange(8), reward.squeeze(-1).long(), action]
    assert torch.allclose(loss, expected.mean(), atol=1e-5)
    assert sample["td_error"].shape == (8,) and torch.allclose(sample["td_error"], expected, atol=1e-5)


def test_c51_trains_on_atari_frames_stored_once(tmp_path):
    """The frame replay (each 84x84 frame stored once) feeds C51's loss on the Nature CNN (batches of 8: which frames
    reach the loss does not depend on how many are drawn, and each Nature-CNN sample costs ~1 ms of a CPU core)."""
    result = run_cli("algo=c51", "env=Pong", "profile=smoke", "replay.frames_once=true", "replay.size=1000",
                     "optim.batch_size=8", "eval.max_episode_steps=50", f"run_dir={tmp_path}", timeout=280)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    s = summary(tmp_path)
    assert s["status"] == "completed" and s["env_steps"] == 300 and s["optim_steps"] == 100
    assert math.isfinite(s["eval_return_last"])
    assert load_checkpoint(tmp_path / "checkpoints" / "last.pt")["learner"]["steps"] == 100


def test_c51_runs_on_the_ray_engine(tmp_path):
    """profile=ray_smoke: collector actors, the replay actor and two Gloo learner ranks run C51 as they run DQN (3
    rounds, the 2 of prefill and one that learns, evaluated at 1,000 env steps and at the end: what the 2 later rounds
    of the profile would add is the same round again)."""
    result = run_cli("algo=c51", "profile=ray_smoke", "total_env_steps=1200", f"run_dir={tmp_path}", timeout=280)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    s = summary(tmp_path)
    assert s["engine"] == "ray" and s["status"] == "completed" and s["env_steps"] == 1200
    assert s["optim_steps"] > 0 and math.isfinite(s["eval_return_last"])
    assert not wait_no_ray(), "Ray processes left behind"
