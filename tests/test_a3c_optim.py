"""Shared optimizers and the gradient hand-over (the known A3C aliasing bug must not exist here)."""
import copy

import pytest
import torch
from torch import nn

from a3c.learner import A3CLearner
from a3c.optim import SharedAdam, SharedRMSprop, copy_gradients
from shared.models import AtariActorCritic
from test_a3c_learner import fake_rollout


def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


@pytest.mark.parametrize("shared_cls, torch_cls, kwargs", [
    (SharedAdam, torch.optim.Adam, {"lr": 1e-2, "eps": 1e-5, "weight_decay": 1e-3}),
    (SharedAdam, torch.optim.Adam, {"lr": 3e-3, "amsgrad": True}),
    (SharedRMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.99, "eps": 1e-5}),
    (SharedRMSprop, torch.optim.RMSprop, {"lr": 1e-2, "momentum": 0.9, "centered": True}),
])
def test_shared_optimizer_matches_torch_step_for_step(shared_cls, torch_cls, kwargs):
    ours, reference = _net(), _net()
    opt_ours, opt_ref = shared_cls(ours.parameters(), **kwargs), torch_cls(reference.parameters(), **kwargs)
    assert all(t.is_shared() for state in opt_ours.state.values() for t in state.values())
    torch.manual_seed(1)
    for _ in range(6):
        x = torch.randn(16, 5)
        for net, opt in ((ours, opt_ours), (reference, opt_ref)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            opt.step()
        for p, q in zip(ours.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert float(next(iter(opt_ours.state.values()))["step"]) == 6


def test_rmsprop_started_at_one_is_tensorflows_rule_and_takes_small_first_steps():
    """initial_square_avg=1 is the RMSProp rule of TensorFlow (OpenAI baselines' A2C): torch's update from a square
    average of ones. torch's own start at 0 makes the first step ~10x lr per weight, whatever the gradient's size."""
    ours, reference, torch_start = _net(), _net(), _net()
    kwargs = {"lr": 1e-2, "alpha": 0.99, "eps": 1e-5}
    opt_ours = SharedRMSprop(ours.parameters(), initial_square_avg=1.0, **kwargs)
    opt_ref = torch.optim.RMSprop(reference.parameters(), **kwargs)
    for p in reference.parameters():  # torch uses a state that exists instead of creating one
        opt_ref.state[p] = {"step": torch.zeros(()), "square_avg": torch.ones_like(p)}
    opt_torch_start = SharedRMSprop(torch_start.parameters(), **kwargs)
    before = [p.detach().clone() for p in ours.parameters()]
    x = torch.randn(16, 5)
    for step in range(4):
        for net, opt in ((ours, opt_ours), (reference, opt_ref), (torch_start, opt_torch_start)):
            opt.zero_grad()
            (1e-3 * net(x).pow(2).mean()).backward()
            opt.step()
        if step == 0:
            ours_move = max((p - b).abs().max() for p, b in zip(ours.parameters(), before))
            torch_move = max((p - b).abs().max() for p, b in zip(torch_start.parameters(), before))
            assert ours_move < 1e-4 and torch_move > 5 * kwargs["lr"]  # tiny gradients: small steps vs ~10 lr
        for p, q in zip(ours.parameters(), reference.parameters()):
            torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert all(t.is_shared() for state in opt_ours.state.values() for t in state.values())


def test_loaded_optimizer_state_is_shared_again():
    net = _net()
    opt = SharedAdam(net.parameters(), lr=1e-3)
    net(torch.randn(2, 5)).sum().backward()
    opt.step()
    fresh = SharedAdam(_net().parameters(), lr=1e-3)
    fresh.load_state_dict(opt.state_dict())
    assert all(t.is_shared() for state in fresh.state.values() for t in state.values())
    assert float(next(iter(fresh.state.values()))["step"]) == 1


def test_copy_gradients_copies_and_never_aliases():
    local, global_model = _net(), _net()
    local(torch.randn(4, 5)).sum().backward()
    copy_gradients(local, global_model)
    for lp, gp in zip(local.parameters(), global_model.parameters()):
        assert gp.grad.data_ptr() != lp.grad.data_ptr()
        torch.testing.assert_close(gp.grad, lp.grad)
    before = [gp.grad.clone() for gp in global_model.parameters()]
    local.zero_grad(set_to_none=False)
    for lp in local.parameters():
        lp.grad.add_(1.0)
    assert all(torch.equal(b, gp.grad) for b, gp in zip(before, global_model.parameters()))


def _loss_grad(model, rollout, *, gamma, gae_lambda, entropy_coeff, critic_coeff, **_):
    """Gradient of the A3C loss of one rollout at ``model``'s weights, written out by hand (no torchrl, no learner):
    GAE over the acting values, then -log pi(a|s) A, critic_coeff (V(s) - (A + v))^2 and -entropy_coeff H, each
    averaged over the rollout's steps."""
    probe = copy.deepcopy(model)
    reward, done = rollout["next", "reward"][..., 0], rollout["next", "done"][..., 0].float()
    value, next_value = rollout["state_value"][..., 0], rollout["next", "state_value"][..., 0]
    advantage = torch.zeros_like(reward)
    running = torch.zeros(reward.shape[0])
    for t in reversed(range(reward.shape[1])):
        delta = reward[:, t] + gamma * (1 - done[:, t]) * next_value[:, t] - value[:, t]
        running = delta + gamma * gae_lambda * (1 - done[:, t]) * running
        advantage[:, t] = running
    target = (advantage + value).reshape(-1)
    logits, v = probe(rollout["observation"].flatten(0, 1))
    dist = torch.distributions.Categorical(logits=logits)
    policy = -(dist.log_prob(rollout["action"].reshape(-1)) * advantage.reshape(-1)).mean()
    critic = critic_coeff * (v.squeeze(-1) - target).pow(2).mean()
    entropy = -entropy_coeff * dist.entropy().mean()
    (policy + critic + entropy).backward()
    return [p.grad.clone() for p in probe.parameters()]


def test_global_update_is_the_gradient_of_that_rollout_alone():
    torch.manual_seed(0)
    hyper = dict(gamma=0.99, gae_lambda=0.95, entropy_coeff=0.01, critic_coeff=0.5, loss_critic_type="l2",
                 max_grad_norm=1e9, rollout_size=12)
    global_model = AtariActorCritic(num_actions=4, in_channels=2, image_size=36, arch="small").share_memory()
    local = copy.deepcopy(global_model)
    lr = 0.05
    learner = A3CLearner(local, global_model, torch.optim.SGD(global_model.parameters(), lr=lr), **hyper)
    for seed in range(3):
        rollout = fake_rollout(seed)
        learner.sync()
        before = [p.detach().clone() for p in global_model.parameters()]
        expected = _loss_grad(global_model, rollout, **hyper)
        learner.update(rollout)
        for p, b, g in zip(global_model.parameters(), before, expected):
            torch.testing.assert_close(p.grad, g, rtol=1e-4, atol=1e-6)  # this rollout's gradient alone
            torch.testing.assert_close(p.detach(), b - lr * p.grad, rtol=0, atol=1e-7)
        assert all(p.grad is None for p in local.parameters())  # local gradients zeroed after each update
