"""The compiled learner step (``compile.enabled=true``): the same update as the eager step, no recompilation after the
warm-up for any algorithm, and a recompilation counter that does count."""
from __future__ import annotations

import pytest
import torch
from offpolicy_helpers import compiled_random_as_eager, smoke_parts, summary, train_inprocess

from offpolicy.algos import ALGORITHMS, ALGOS
from offpolicy.learner import make_learner
from shared import compat


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


def _learned(parts, names=None) -> dict[str, torch.Tensor]:
    """The loss's parameters and floating-point buffers (target networks, BatchRenorm statistics) by name, those in
    ``names`` only if given."""
    tensors = {**dict(parts.loss.named_parameters()),
               **{k: b for k, b in parts.loss.named_buffers() if b.is_floating_point()}}
    return {k: v.detach().clone() for k, v in tensors.items() if names is None or k in names}


# settings under which an algorithm's comparison covers more of the step (clipping, hard or soft targets)
MORE_OF_THE_STEP = {"dqn": ["optim.max_grad_norm=0.5", "target.mode=hard", "target.hard_every=2"],
                    "ddpg": ["optim.critic_max_grad_norm=0.5", "target.tau=0.1"],
                    # the 8 steps go past twice the renormalisation warm-up (where torchrl's counter bug showed)
                    "crossq": ["crossq.renorm_warmup_steps=2"]}
# what a compiled learner is compared with: the eager one, except where eager and compiled are known to drift apart.
# CrossQ: biases feeding a train-mode BatchRenorm get rounding-noise gradients that Adam turns into +-lr steps (~2e-3
# apart after 20 steps, shared/DESIGN.md "Facts found 2026-12-04"), so it is held to the fully guarded compiled step
REFERENCE = {"crossq": ["compile.enabled=true", "compile.skip_guards=false"]}


def test_compiled_random_as_eager_draws_eager_torch_s_numbers():
    def noisy(x):
        return x + torch.randn(x.shape)

    x = torch.zeros(8)
    torch.manual_seed(3)
    eager = noisy(x)
    with compiled_random_as_eager():
        torch.manual_seed(3)
        compiled = torch.compile(noisy)(x)
    assert torch.equal(compiled, eager)


@pytest.mark.parametrize("algo", [a for a in ALGOS if ALGORITHMS[a].compiles])
def test_compiled_learner_makes_the_reference_update_without_recompiling(algo):
    """Every algorithm, compiled with its default guards, from the same networks on the same batches and the same
    random draws (inductor's random ops fall back to eager torch's): the same networks, targets and losses as the
    reference learner (clips, hard and soft targets, TD3's and REDQ's delayed actor), and no recompilation in the
    steps after its warm-up."""
    overrides = MORE_OF_THE_STEP.get(algo, [])
    with compiled_random_as_eager():
        reference, reference_parts, replay = _learner(algo, *overrides, *REFERENCE.get(algo, []))
        compiled, compiled_parts, _ = _learner(algo, *overrides, "compile.enabled=true")
        initial = _learned(compiled_parts)
        torch.testing.assert_close(_learned(reference_parts), initial, rtol=0, atol=0)
        steps = compiled.warmup_steps + 2
        torch.manual_seed(1)
        out_reference = reference.update(replay, steps, version=1)
        torch.manual_seed(1)
        out_compiled = compiled.update(replay, steps, version=1)
    learned = _learned(compiled_parts, initial)
    assert any(not torch.equal(learned[k], initial[k]) for k in initial)  # it learned
    torch.testing.assert_close(learned, _learned(reference_parts, initial), rtol=1e-4, atol=1e-5)
    losses = [key for key in out_reference if key.startswith("loss/")]
    assert losses and {key: out_compiled[key] for key in losses} == pytest.approx(
        {key: out_reference[key] for key in losses}, rel=1e-4, abs=1e-5)
    if compiled.target_updater is not None:
        assert compiled.target_updater.updates == reference.target_updater.updates > 0
    assert out_compiled["compile/recompiles"] == 0
    if algo == "crossq":  # and against the eager step: the renormalisation's counters and running statistics
        with compiled_random_as_eager():
            eager, eager_parts, _ = _learner(algo, *overrides)
            torch.manual_seed(1)
            eager.update(replay, steps, version=1)
        renorm = {k: v for k, v in _learned(eager_parts, initial).items() if "running" in k}
        # clamped at the warm-up before each forward, which counts one more: 3 (torchrl's own: one per forward)
        counters = {k: b for k, b in compiled_parts.loss.named_buffers() if k.endswith("num_batches_tracked")}
        assert renorm and counters and all(torch.equal(b, torch.full_like(b, 3)) for b in counters.values())
        assert all(torch.equal(b, counters[k]) for k, b in eager_parts.loss.named_buffers() if k in counters)
        torch.testing.assert_close({k: learned[k] for k in renorm}, renorm, rtol=1e-3, atol=1e-3)
    # checkpoints between compiled steps: SAC's second one failed (its target entropy gone) and ended a 300k run
    compiled.state_dict()
    compiled.update(replay, 1, version=2)
    assert compiled.state_dict()["loss"].keys() == reference.state_dict()["loss"].keys()


def test_a_fully_guarded_compiled_step_does_not_recompile_either(monkeypatch):
    """With every guard kept (compile.skip_guards=false) SAC's Q-ensemble loss compiles once: tensordict's pytree
    edits around the ensemble's loop (which change a guarded dict's version on every call) stay out of the compiled
    step. The parts are built from torchrl's own pseudo-vmap (as in a fresh process): the Builder, which every path
    to an algorithm's parts goes through, puts ours in place before the loss is built. The default guard filter
    would hide the edits' return: without the Builder's step SAC recompiled on every step, and this test fails."""
    from torchrl.objectives import utils

    compat.pseudo_vmap_without_pytree_edits()
    monkeypatch.setattr(utils, "_pseudo_vmap", utils._pseudo_vmap.torchrl_original)  # restored afterwards
    learner, _, replay = _learner("sac", "compile.enabled=true", "compile.skip_guards=false")
    out = learner.update(replay, learner.warmup_steps + 3, version=1)
    assert out["compile/recompiles"] == 0


def test_only_the_learner_s_own_recompilations_are_counted():
    """After the warm-up, an unrelated compiled function leaves the learner's count at 0; a batch of another size
    is one recompilation (it compiles the step for any batch size, so a third size needs none)."""
    learner, _, replay = _learner("dqn", "compile.enabled=true")
    learner.update(replay, learner.warmup_steps + 1, version=1)
    assert learner.recompiles == 0
    unrelated = torch.compile(lambda x: x.sin() + 1)
    unrelated(torch.ones(3))
    learner.update(replay, 2, version=1)
    assert learner.recompiles == 0
    learner.sample_shape = (16,)
    learner.update(replay, 2, version=1)
    assert learner.recompiles == 1
    learner.sample_shape = (8,)
    learner.update(replay, 2, version=1)
    assert learner.recompiles == 1


@pytest.mark.parametrize("skip_guards", ["true", "false"])
def test_a_compile_mode_compiles_with_or_without_the_guard_filter(skip_guards, capsys):
    """``compile.mode`` with the default guard filter: torch.compile takes a mode or options, so the learner passes the
    mode as its options; the step stays compiled (no fallback to eager, no warning) either way."""
    learner, _, replay = _learner("dqn", "compile.enabled=true", "compile.mode=default",
                                  f"compile.skip_guards={skip_guards}")
    learner.update(replay, learner.warmup_steps + 1, version=1)
    assert learner.compile.enabled and learner.compile.mode == "default"
    assert learner.recompiles == 0
    assert "warning" not in capsys.readouterr().err


def test_the_learner_passes_its_mode_to_torch_compile_as_options(monkeypatch):
    """With the guard filter, torch.compile gets no ``mode`` but the mode's inductor options and the filter (compiled
    here without the autotuning options, which only this assertion needs)."""
    passed, compile_ = [], torch.compile

    def recording_compile(fn, *, mode=None, options=None):
        passed.append((mode, options))
        return compile_(fn, options={"guard_filter_fn": options["guard_filter_fn"]})

    monkeypatch.setattr(torch, "compile", recording_compile)
    learner, _, replay = _learner("dqn", "compile.enabled=true", "compile.mode=max-autotune-no-cudagraphs")
    learner.update(replay, 1, version=1)
    (mode, options), = passed
    assert mode is None
    assert options == {**compat.compile_mode_options("max-autotune-no-cudagraphs"),
                       "guard_filter_fn": options["guard_filter_fn"]} and options["max_autotune"] is True


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


def test_a_compiled_run_reports_its_recompiles(tmp_path):
    """A whole compiled smoke run: every optimiser step compiled, and the learner's count (0 after the warm-up)
    reaches the result and summary.json. Every algorithm's count is checked by the learner test above."""
    s = train_inprocess("algo=dqn", "profile=smoke", "compile.enabled=true", "eval.interval_env_steps=0",
                        "eval.final_episodes=0", f"run_dir={tmp_path}")
    assert s["status"] == "completed" and s["error"] is None and s["optim_steps"] == 100
    assert s["compile_recompiles"] == 0
    assert summary(tmp_path)["compile_recompiles"] == 0


# --- compile.enabled=auto, and eager when torch.compile fails ------------------------------------------------------
def _choice(*overrides):
    from offpolicy.compiling import compile_choice
    from offpolicy.config import compose_config

    return compile_choice(compose_config(["algo=sac", "env=Pendulum-v1", *overrides])[0])


@pytest.mark.parametrize("overrides, enabled, reason", [
    # smoke: 3 rounds of 100, replay reaches the 200-step prefill in round 2: rounds 2 and 3 learn, 100 steps each
    (["profile=smoke"], False, "compile.enabled=auto: 200 planned optimiser steps < 25,000"),
    # 1,000-step rounds: rounds 5 to 29 learn (the round that fills the prefill included)
    (["total_env_steps=29000", "collector.prefill_env_steps=5000"], True,
     "compile.enabled=auto: 25,000 planned optimiser steps >= 25,000"),
    (["total_env_steps=28000", "collector.prefill_env_steps=5000"], False,
     "compile.enabled=auto: 24,000 planned optimiser steps < 25,000"),
    (["total_env_steps=28001", "collector.prefill_env_steps=5000"], True,  # a last, partly needed round runs whole
     "compile.enabled=auto: 25,000 planned optimiser steps >= 25,000"),
    (["total_env_steps=54000", "collector.prefill_env_steps=5000", "optim.utd_ratio=0.5"], True,
     "compile.enabled=auto: 25,000 planned optimiser steps >= 25,000"),
    (["total_env_steps=29000", "collector.prefill_env_steps=5000", "compile.auto_min_optim_steps=25001"], False,
     "compile.enabled=auto: 25,000 planned optimiser steps < 25,001"),
    (["compile.enabled=false"], False, "compile.enabled=false"),
    (["profile=smoke", "compile.enabled=true"], True, "compile.enabled=true"),
])
def test_auto_compiles_the_runs_long_enough_to_repay_it(overrides, enabled, reason):
    """auto compiles from compile.auto_min_optim_steps planned optimiser steps (the steps the loop will run) on; true
    and false force either path."""
    choice = _choice(*overrides)
    assert (choice.enabled, choice.reason) == (enabled, reason)


def test_the_default_commands_compile_and_smoke_runs_do_not():
    """What a user gets without a compile flag: SAC's default (1M env steps), DQN's profile=atari (1M agent steps at
    UTD 0.1) compile; every smoke profile stays eager."""
    from offpolicy.compiling import compile_choice
    from offpolicy.config import compose_config

    for args in (["algo=sac"], ["algo=td3"], ["algo=dqn", "profile=atari"]):
        assert compile_choice(compose_config(args)[0]).enabled, args
    for algo in ALGOS:
        assert not compile_choice(compose_config([f"algo={algo}", "profile=smoke"])[0]).enabled, algo


@pytest.fixture
def broken_compiler(monkeypatch):
    """torch.compile raising as it does where inductor finds no C++ compiler; the probe's cached verdict is dropped
    before and after."""
    from offpolicy.compiling import compiler_failure

    def compile_fails(*args, **kwargs):
        raise RuntimeError("InductorError: no working C++ compiler found\n(a long compiler log)")

    compiler_failure.cache_clear()
    monkeypatch.setattr(torch, "compile", compile_fails)
    yield
    compiler_failure.cache_clear()


def test_a_run_where_torch_compile_fails_is_eager_with_one_warning(broken_compiler, tmp_path, capsys):
    s = train_inprocess("algo=dqn", "profile=smoke", "compile.enabled=true", "eval.interval_env_steps=0",
                        "eval.final_episodes=0", f"run_dir={tmp_path}")
    out, err = capsys.readouterr()
    assert s["status"] == "completed" and s["optim_steps"] == 100 and s["compile_recompiles"] is None
    reason = "RuntimeError: InductorError: no working C++ compiler found"
    assert [line for line in err.splitlines() if line.startswith("warning")] == [
        f"warning: torch.compile fails here ({reason}); the run is eager"]
    assert f"learner step eager (compile.enabled=true, but torch.compile fails here: {reason})" in out


def _compile_to_failing_calls(monkeypatch):
    """torch.compile returns a function that fails when called, as a compiler error on one step's graph does."""
    def compile_to_failing(fn, **kwargs):
        def call(*args):
            raise RuntimeError("BackendCompilerFailed: forced for the test\n(a long traceback)")
        return call

    monkeypatch.setattr(torch, "compile", compile_to_failing)


def test_a_compiled_step_that_fails_falls_back_to_the_eager_update(monkeypatch, capsys):
    """TD3 (two kinds of step): the first compiled step fails, the learner warns once and makes, from the same
    networks and batches, exactly the eager learner's update."""
    eager, eager_parts, replay = _learner("td3")
    compiled, parts, _ = _learner("td3", "compile.enabled=true")
    assert compiled.compile.enabled
    _compile_to_failing_calls(monkeypatch)
    torch.manual_seed(1)
    eager.update(replay, 6, version=1)
    torch.manual_seed(1)
    out = compiled.update(replay, 6, version=1)
    torch.testing.assert_close(_learned(parts), _learned(eager_parts), rtol=0, atol=0)
    assert not compiled.compile.enabled and compiled.recompiles is None and "compile/recompiles" not in out
    assert [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning")] == [
        "warning: the compiled learner step failed (RuntimeError: BackendCompilerFailed: forced for the test); the "
        "learner runs eager from here"]


def test_an_error_of_the_step_itself_is_raised_not_hidden_by_the_fallback(monkeypatch):
    compiled, parts, replay = _learner("dqn", "compile.enabled=true")
    _compile_to_failing_calls(monkeypatch)

    def broken(*args, **kwargs):
        raise ValueError("the loss itself is broken")

    monkeypatch.setattr(parts.loss, "forward", broken)
    with pytest.raises(ValueError, match="the loss itself is broken"):
        compiled.update(replay, 1, version=1)
