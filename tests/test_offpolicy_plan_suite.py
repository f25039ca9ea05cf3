"""``python -m offpolicy.plan``: every profile composes and plans, with the numbers the scale profiles promise; broken
invariants are one error line and exit 2. ``python -m offpolicy.suite``: every algorithm in its own process, every
failure recorded."""
from __future__ import annotations

import json

import pytest
from proc import run_module

from offpolicy.plan import make_plan
from offpolicy.config import compose_config
from shared.config import CONFIG_ROOT, ConfigError

PROFILES = sorted(p.stem for p in (CONFIG_ROOT / "offpolicy" / "profile").glob("*.yaml"))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_plans(profile):
    algo = "dqn" if profile == "atari" else "sac"  # the Atari profile is DQN's
    cfg, _ = compose_config([f"algo={algo}", f"profile={profile}"])
    plan = make_plan(cfg)
    assert plan["transitions"] >= cfg.total_env_steps and plan["envs"] == plan["collectors"] * cfg.env.num_envs
    assert plan["batch_per_rank"] * plan["learner_ranks"] == cfg.optim.batch_size
    assert plan["optim_steps_total"] > 0 and plan["bytes_per_transition"] > 0


@pytest.mark.parametrize("profile,env,transition_bytes", [("scale", "HalfCheetah-v5", 212),
                                                         ("humanoid_scale", "Humanoid-v5", 2904)])
def test_scale_profiles_match_the_seed_suite(profile, env, transition_bytes):
    cfg, _ = compose_config(["algo=sac", f"profile={profile}"])
    p = make_plan(cfg)
    assert p["env"] == env and p["engine"] == "ray" and p["learner_backend"] == "nccl"
    assert p["envs"] == 100_000 and p["collectors"] == 4 and p["learner_ranks"] == 4
    assert p["transitions"] == 200_000_000 and p["transitions_per_env"] == 2_000
    assert p["prefill_env_steps"] == 10_000_000 and p["replay_size"] == 20_000_000
    assert p["global_batch"] == 16_384 and p["batch_per_rank"] == 4_096
    assert p["optim_steps_per_round"] == 25 and p["env_steps_per_round"] == 100_000
    assert p["replay_ratio"] == pytest.approx(4.096)
    assert p["optim_steps_total"] == (2_000 - 99) * 25  # no optimiser step in the 99 rounds before 10M
    assert p["evaluations"] == 20 and p["eval_episodes"] == 64 and p["eval_max_episode_steps"] == 1_000
    assert p["bytes_per_transition"] == transition_bytes
    assert p["replay_bytes"] == transition_bytes * 20_000_000
    assert p["resources"] == {"CPU": 4 * 8 + 4 * 4, "GPU": 8}


def test_plan_rejects_a_broken_invariant():
    result = run_module("offpolicy.plan", "algo=sac", "profile=scale", "ray.world_size=3", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: optim.batch_size=16384 is not allowed; allowed: a multiple of ray.world_size=3")
    with pytest.raises(ConfigError, match=r"optim.replay_ratio=4.096 is not allowed; allowed: optim.batch_size \* "
                                          r"optim.utd_ratio = 8.192 \(or null\)"):
        compose_config(["algo=sac", "profile=scale", "optim.utd_ratio=0.0005"])


def test_plan_prints_lines_and_json():
    result = run_module("offpolicy.plan", "algo=dqn", "profile=smoke", timeout=60)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "dqn on CartPole-v1, engine local"
    assert json.loads(lines[-1])["optim_steps_total"] == 2 * 50


def test_suite_records_every_failure(tmp_path):
    """sac cannot run on CartPole (exit 2); the suite still runs dqn after it and reports both."""
    result = run_module("offpolicy.suite", "profile=smoke", "algos=sac,dqn", "env=CartPole-v1",
                        "eval.final_episodes=0", f"suite_dir={tmp_path}", timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "suite.json").read_text())
    assert report["passed"] == 1 and report["failed"] == ["sac"]
    sac, dqn = report["runs"]
    assert sac["exit_code"] == 2 and sac["error"].startswith("error: env.name='CartPole-v1' has no bounded")
    assert sac["summary"] is None
    assert dqn["ok"] and dqn["summary"]["status"] == "completed" and dqn["summary"]["env_steps"] == 300
