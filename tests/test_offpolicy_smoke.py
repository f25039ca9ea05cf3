"""CI smoke runs of every algorithm (profile=smoke: three collection + optimisation iterations) as subprocesses."""
from __future__ import annotations

import pytest
from offpolicy_helpers import run_cli, summary

from offpolicy.algos import ALGOS, algorithm
from offpolicy.compiling import planned_optim_steps
from offpolicy.config import compose_config
from shared.logging import read_scalars

# every registered algorithm runs; REDQ's UTD of 20 is cut to 1 here to keep CI short (tests/test_offpolicy_algos.py
# steps it at 20)
OVERRIDES = {"redq": ["optim.utd_ratio=1"]}


def test_smoke_overrides_name_registered_algorithms():
    assert set(OVERRIDES) <= set(ALGOS)


@pytest.mark.parametrize("algo", ALGOS)
def test_smoke_run(algo, tmp_path):
    run_dir = tmp_path / algo
    args = [f"algo={algo}", "profile=smoke", *OVERRIDES.get(algo, [])]
    cfg, _ = compose_config(args)
    steps_per_batch = round(cfg.optim.utd_ratio * cfg.collector.env_steps_per_batch)
    proc = run_cli(*args, f"run_dir={run_dir}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "UTD" in proc.stdout  # the update-to-data ratio is printed at start
    s = summary(run_dir)
    assert s["status"] == "completed" and s["error"] is None  # every invariant held
    # 300 frames in 3 batches; prefill is 200 frames, so the first batch runs no optimiser step
    assert s["env_steps"] == 300 and s["batches"] == 3 and s["replay_writes"] == 300
    assert s["policy_version"] == 3
    assert s["compile_recompiles"] is None  # eager learner (compiled runs: tests/test_offpolicy_compile.py)
    assert s["optim_steps"] == 2 * steps_per_batch == planned_optim_steps(cfg) > 0  # the plan compile auto reads
    assert s["env"] == cfg.env.name  # the algorithm's default env
    discrete = algorithm(algo).discrete
    for name in ("loss/grad_norm_q" if discrete else "loss/grad_norm_critic", "collector/env_steps_per_s",
                 "replay/action_std", "time/env_steps_per_s", "train/optim_steps", "eval/return"):
        steps, values = read_scalars(run_dir, name)
        assert steps, f"{name} was never logged"
    if not discrete:
        _, saturation = read_scalars(run_dir, "replay/action_saturation")
        assert all(0.0 <= v <= 1.0 for v in saturation)
        assert read_scalars(run_dir, "replay/action_std_5")[0]  # per-dimension std (HalfCheetah has 6 dims)
    assert (run_dir / "curves.png").stat().st_size > 0
    assert (run_dir / "checkpoints" / "last.pt").exists()


def test_failing_evaluation_is_reported_at_once_and_training_goes_on(tmp_path, capsys, monkeypatch):
    """An evaluator that fails: one warning line as soon as it happens, training completes, the summary has the
    error."""
    from offpolicy import train
    from offpolicy.builder import Builder
    from offpolicy.config import compose_config

    def broken_eval_env(builder, **kwargs):
        raise RuntimeError("no display for the evaluation env")

    cfg, _ = compose_config(["algo=dqn", "profile=smoke", f"run_dir={tmp_path}"])
    monkeypatch.setattr(Builder, "eval_env", broken_eval_env)
    s = train.train(cfg)
    assert s["status"] == "completed" and s["env_steps"] == 300 and s["optim_steps"] == 100
    assert s["eval_error"] == ("evaluation at 200 env steps failed: RuntimeError: no display for the evaluation env")
    assert summary(tmp_path)["eval_error"] == s["eval_error"]
    err = capsys.readouterr().err
    assert err.count("warning: evaluation at 200 env steps failed") == 1  # once, at the first failure
