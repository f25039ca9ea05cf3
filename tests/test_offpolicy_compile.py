"""The compiled learner step (``compile.enabled=true``): the same update as the eager step, no recompilation after the
warm-up for any algorithm, and a recompilation counter that does count."""
from __future__ import annotations

import pytest
import torch
from offpolicy_helpers import smoke_parts, summary, train_inprocess

from offpolicy.learner import make_learner


class _Replay:
    """The same transitions in the same order on every call (cycled), so two learners see identical batches."""

    def __init__(self, batch):
        self.batch = batch

    def sample(self, n):
        return self.batch[torch.arange(n) % self.batch.numel()].clone()


def _learner(algo, *overrides, batch_size=32):
    cfg, env, parts, batch = smoke_parts(algo, f"optim.batch_size={batch_size}", *overrides)
    learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(batch_size,))
    return learner, parts, _Replay(batch)


def _all_params(parts):
    return torch.cat([p.detach().reshape(-1) for p in parts.loss.parameters()] +
                     [b.detach().reshape(-1) for b in parts.loss.buffers() if b.is_floating_point()])


@pytest.mark.parametrize("algo, overrides", [
    ("dqn", ["optim.max_grad_norm=0.5", "target.mode=hard", "target.hard_every=2"]),
    ("ddpg", ["optim.critic_max_grad_norm=0.5", "target.tau=0.1"]),
])
def test_compiled_step_makes_the_eager_update(algo, overrides):
    """DQN and DDPG losses draw no random numbers, so eager and compiled learners from the same initial networks on
    the same batches must end with the same networks, targets and losses (clips, hard and soft targets included)."""
    eager, eager_parts, replay = _learner(algo, *overrides)
    compiled, compiled_parts, _ = _learner(algo, *overrides, "compile.enabled=true")
    assert torch.equal(_all_params(eager_parts), _all_params(compiled_parts))
    out_eager = eager.update(replay, 5, version=1)
    out_compiled = compiled.update(replay, 5, version=1)
    assert not torch.equal(_all_params(eager_parts), _all_params(_learner(algo, *overrides)[1]))  # it learned
    torch.testing.assert_close(_all_params(compiled_parts), _all_params(eager_parts), rtol=1e-4, atol=1e-5)
    for key, value in out_eager.items():
        if key.startswith("loss/"):
            assert out_compiled[key] == pytest.approx(value, rel=1e-4, abs=1e-5), key
    assert compiled.target_updater.updates == eager.target_updater.updates == 5
    assert out_compiled["compile/recompiles"] == 0 and "compile/recompiles" not in out_eager


def test_recompilation_after_the_warm_up_is_counted():
    """A batch of another size after the warm-up forces a new graph: the counter must see it."""
    learner, _, replay = _learner("dqn", "compile.enabled=true")
    learner.update(replay, learner.warmup_steps + 1, version=1)
    assert learner.recompiles == 0
    learner.sample_shape = (16,)
    learner.update(replay, 1, version=1)
    assert learner.recompiles >= 1


@pytest.mark.parametrize("algo, overrides", [
    ("dqn", ["optim.max_grad_norm=0.5", "target.mode=hard", "target.hard_every=2"]),
    ("td3", ["td3.policy_delay=2"]),
])
def test_skipped_guards_make_the_same_update(algo, overrides):
    """``compile.skip_guards`` (the default: only the tensor and global-state guards): the same updates as the fully
    guarded compiled step (``compile.skip_guards=false``), with no recompilation; TD3's two kinds of step (critic
    only, then critic and delayed actor) each run their own graphs (with the kinds mixed up the actor would not
    learn, or learn on every step). Both learners draw TD3's target-smoothing noise from the same seeds."""
    torch.compiler.reset()  # shapes seen by earlier tests' steps would start the graphs dynamic (torch's automatic
    #                         dynamic shapes, kept per function name), and the batch of 16 below would then fit one
    torch.manual_seed(0)
    guarded, guarded_parts, replay = _learner(algo, *overrides, "compile.enabled=true", "compile.skip_guards=false")
    torch.manual_seed(0)
    skipping, skipping_parts, _ = _learner(algo, *overrides, "compile.enabled=true", "compile.skip_guards=true")
    torch.manual_seed(1)
    guarded.update(replay, 8, version=1)
    torch.manual_seed(1)
    out = skipping.update(replay, 8, version=1)
    assert not torch.equal(_all_params(skipping_parts), _all_params(_learner(algo, *overrides)[1]))  # it learned
    assert torch.equal(_all_params(skipping_parts), _all_params(guarded_parts))
    assert out["compile/recompiles"] == 0
    skipping.sample_shape = (16,)  # a batch of another shape still gets a graph of its own
    skipping.update(replay, 1, version=1)
    assert skipping.recompiles >= 1


def test_relu_is_the_same_function_compiled_and_eager():
    """shared.models.ReLU (relu without a boolean mask under torch.compile) gives nn.ReLU's values and gradients."""
    from shared.models import ReLU

    x = torch.tensor([-2.0, -0.5, 0.0, 0.5, 3.0, float("nan")]).repeat(64, 1)
    for fn in (ReLU(), torch.compile(ReLU())):
        xs = x.clone().requires_grad_()
        ys = fn(xs)
        (ys.nan_to_num() * torch.arange(6.0)).sum().backward()
        reference = x.clone().requires_grad_()
        expected = torch.nn.ReLU()(reference)
        (expected.nan_to_num() * torch.arange(6.0)).sum().backward()
        torch.testing.assert_close(ys, expected, equal_nan=True)
        torch.testing.assert_close(xs.grad, reference.grad, equal_nan=True)


def test_a_checkpoint_resumes_with_this_runs_optimiser_implementation():
    """A checkpoint written with the plain (foreach) Adam, as compiled runs before 2026-12-02 did, resumes with this
    run's fused Adam, compiled or not."""
    old, old_parts, replay = _learner("sac")
    for optimizer in old_parts.optimizers.values():
        optimizer.param_groups[0].update(fused=None, foreach=True)
    old.update(replay, 2, version=1)
    compiled, parts, _ = _learner("sac", "compile.enabled=true")
    compiled.load_state_dict(old.state_dict())
    for optimizer in parts.optimizers.values():
        assert optimizer.param_groups[0]["fused"] is True and not optimizer.param_groups[0]["foreach"]
    assert compiled.steps == 2 and compiled.update(replay, 4, version=1)["compile/recompiles"] == 0


@pytest.mark.parametrize("algo", ["dqn", "sac", "td3", "ddpg"])
def test_compiled_run_completes_without_recompiles(algo, tmp_path):
    """A whole compiled smoke run of each algorithm: every optimiser step compiled, 0 recompiles after warm-up."""
    s = train_inprocess(f"algo={algo}", "profile=smoke", "compile.enabled=true", "eval.interval_env_steps=0",
                        "eval.final_episodes=0", f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["error"] is None
    assert s["optim_steps"] == (100 if algo == "dqn" else 200)
    assert s["compile_recompiles"] == 0
    assert summary(tmp_path)["compile_recompiles"] == 0
