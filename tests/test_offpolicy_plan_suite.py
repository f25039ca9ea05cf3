"""``python -m offpolicy.tools.plan``: every profile composes and plans, with the numbers the scale profiles promise;
broken invariants are one error line and exit 2. ``python -m offpolicy.tools.suite``: every algorithm in its own
process, every failure recorded."""
from __future__ import annotations

import json

import pytest
import torch
from proc import run_module

from offpolicy.config import compose_config
from offpolicy.tools.plan import make_plan
from shared.config import CONFIG_ROOT, ConfigError

PROFILES = sorted(p.stem for p in (CONFIG_ROOT / "offpolicy" / "profile").glob("*.yaml"))


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_plans(profile):
    algo = "dqn" if profile.startswith("atari") else "sac"  # the Atari profiles are DQN's
    cfg, _ = compose_config([f"algo={algo}", f"profile={profile}"])
    plan = make_plan(cfg)
    assert plan["transitions"] >= cfg.total_env_steps and plan["envs"] == plan["collectors"] * cfg.env.num_envs
    assert plan["batch_per_rank"] * plan["learner_ranks"] == cfg.optim.batch_size
    assert plan["optim_steps_total"] > 0 and plan["bytes_per_transition"] > 0


@pytest.mark.parametrize("algo,overrides", [("sac", ["env=Pendulum-v1", "collector.prefill_env_steps=250"]),
                                             ("redq", ["env=Pendulum-v1", "optim.utd_ratio=0.5",
                                                       "collector.env_steps_per_batch=60", "total_env_steps=250"])])
def test_plan_counts_match_a_real_run(tmp_path, algo, overrides):
    """The plan's rounds, transitions, replay writes and optimiser steps against what a real run of the same config
    did (not the plan's formulas restated): a prefill and a total that are not whole numbers of rounds."""
    from offpolicy.train import train

    args = [f"algo={algo}", "profile=smoke", *overrides, "eval.interval_env_steps=0", "eval.final_episodes=0",
            f"run_dir={tmp_path}"]
    cfg, _ = compose_config(args)
    plan = make_plan(cfg)
    ran = train(cfg)
    assert ran["status"] == "completed"
    assert (plan["rounds"], plan["transitions"], plan["optim_steps_total"]) == (
        ran["batches"], ran["env_steps"], ran["optim_steps"])
    assert plan["transitions"] == ran["replay_writes"]


# bytes per stored transition, key by key: CartPole (4 float32 observations, 2 one-hot int64 actions) collected by
# our lean collector: observation and next observation 32, action 16, reward and episode return 8, is_init and
# three done flags 4, step counts (root and next) 16, policy version, trajectory id and the buffer's index 24
CARTPOLE_LEAN = 32 + 16 + 8 + 4 + 16 + 24


@pytest.mark.parametrize("overrides,expected", [
    ([], CARTPOLE_LEAN),
    (["loss.n_steps=3"], CARTPOLE_LEAN + 8),  # + steps_to_next_obs (int64)
    # torchrl's Collector also keeps the root done flags, episode return and policy version, next is_init, and the
    # Q values the policy wrote (2 + 1 float32)
    (["collector.lean=false"], CARTPOLE_LEAN + 3 + 4 + 8 + 1 + 12),
])
def test_plan_bytes_per_transition_is_what_the_replay_allocates(overrides, expected):
    """The plan's bytes per transition against the tensors a real replay holds once two env copies' collected
    batches have filled it (every stored key, at the dtype it is stored with, over the capacity)."""
    from offpolicy.builder import Builder
    from offpolicy.collect.statistics import for_replay

    capacity = 64
    cfg, _ = compose_config(["algo=dqn", "env=CartPole-v1", "profile=smoke", "env.num_envs=2",
                             "collector.env_steps_per_batch=20", f"replay.size={capacity}",
                             "collector.prefill_env_steps=40", *overrides])
    builder = Builder(cfg)
    env = builder.train_env()
    collector = builder.collector(env, builder.parts(env).collect_policy)
    replay = builder.replay()
    try:
        for batch in collector:
            replay.extend(for_replay(batch))
            if replay.write_count >= capacity:
                break
    finally:
        collector.shutdown()
    stored = replay.storage.get(torch.arange(capacity))  # every row the storage allocated, as stored
    allocated = sum(t.nbytes for t in stored.values(True, True))
    assert allocated == expected * capacity
    assert make_plan(cfg)["bytes_per_transition"] == allocated / capacity


# measured: torchrl's Collector (envpool, GPU collectors) stores root done flags, episode return, step count and
# policy version, next is_init and the policy's loc and scale beside what our lean collector stores
@pytest.mark.parametrize("profile,env,transition_bytes", [("scale", "HalfCheetah-v5", 276),
                                                         ("humanoid_scale", "Humanoid-v5", 3056)])
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


def test_plan_rejects_a_broken_invariant(capsys):
    """The tool's ``main`` under ``run_cli``, as ``python -m offpolicy.tools.plan`` runs it (that path as a process:
    test_plan_prints_lines_and_json): one error line, exit 2."""
    from offpolicy.tools.plan import main
    from shared.config import run_cli

    with pytest.raises(SystemExit) as exited:
        run_cli(main, ["algo=sac", "profile=scale", "ray.world_size=3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert err[0].startswith("error: optim.batch_size=16384 is not allowed; allowed: a multiple of ray.world_size=3")
    with pytest.raises(ConfigError, match=r"optim.replay_ratio=4.096 is not allowed; allowed: optim.batch_size \* "
                                          r"optim.utd_ratio = 8.192 \(or null\)"):
        compose_config(["algo=sac", "profile=scale", "optim.utd_ratio=0.0005"])


def test_plan_prints_lines_and_json():
    result = run_module("offpolicy.tools.plan", "algo=dqn", "profile=smoke", timeout=180)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0] == "dqn on CartPole-v1, engine local"
    plan = json.loads(lines[-1])
    assert plan["optim_steps_total"] == 2 * 50
    rates, timing = plan["rates"], plan["timing"]
    assert set(rates["env_step_s"]) == {"gymnasium", "envpool"}
    assert all(set(t) == {"1", "64", "1024"} and min(t.values()) > 0 for t in rates["env_step_s"].values())
    assert rates["collector_batch"] == 1 and rates["update_batch"] == 32 and rates["update_s"] > 0
    assert timing["bound"] in ("collect", "replay_write", "learn") and timing["total_s"] > timing["learning_s"] > 0
    assert any(line.startswith("predicted wall time:") for line in lines)
    assert any(line.startswith("env step, envpool: batch 1 ") for line in lines)


def test_plan_without_measuring(capsys):
    from offpolicy.tools.plan import main
    from shared.config import run_cli

    assert main(["algo=dqn", "profile=smoke", "measure=false"]) == 0
    assert "timing" not in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with pytest.raises(SystemExit) as exited:
        run_cli(main, ["algo=dqn", "measure=maybe"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == ["error: measure='maybe' is not allowed; allowed: true, false"]


def test_suite_records_every_failure(tmp_path):
    """sac cannot run on CartPole (exit 2); the suite still runs dqn after it and reports both."""
    result = run_module("offpolicy.tools.suite", "profile=smoke", "algos=sac,dqn", "env=CartPole-v1",
                        "eval.final_episodes=0", f"suite_dir={tmp_path}", timeout=240)
    assert result.returncode == 1, result.stdout + result.stderr
    report = json.loads((tmp_path / "suite.json").read_text())
    assert report["passed"] == 1 and report["failed"] == ["sac"]
    sac, dqn = report["runs"]
    assert sac["exit_code"] == 2 and sac["error"].startswith("error: env.name='CartPole-v1' has no bounded")
    assert sac["summary"] is None
    assert dqn["ok"] and dqn["summary"]["status"] == "completed" and dqn["summary"]["env_steps"] == 300


PLAN = {"envs_per_collector": 100, "env_steps_per_collector_round": 1000, "env_steps_per_round": 1000, "rounds": 10,
        "prefill_rounds": 2, "optim_steps_per_round": 50, "evaluations": 2, "eval_episodes": 3,
        "final_eval_episodes": 1, "eval_max_episode_steps": 200, "eval_interval_env_steps": 5000, "learner_ranks": 1, "learner_backend": "local",
        "engine": "local", "backend": "gymnasium", "collector_cpus": 2, "collector_gpus": 0, "learner_gpus": 0,
        "collector_overlap": False, "ray_actors": False}
RATES = {"collector_batch": 100, "collector_step_s": 0.01, "policy_forward_s": 0.002, "replay_write_s": 1e-5,
         "update_s": 0.02, "eval_step_s": 0.001, "setup_s": 1.5, "matmul_flops": 1e11, "threads": 1, "cores": 2,
         "param_bytes": 1_000_000}


def test_prediction_arithmetic_from_given_rates():
    from offpolicy.tools.plan import predict

    t = predict(PLAN, RATES)
    # 10 collector steps of 0.01 s, 1,000 writes of 10 us, 50 updates of 20 ms
    assert t["round_parts_s"] == pytest.approx({"collect": 0.1, "replay_write": 0.01, "learn": 1.0})
    assert t["round_s"] == pytest.approx(1.11) and t["bound"] == "learn"
    assert t["prefill_s"] == pytest.approx(2 * 0.11) and t["learning_s"] == pytest.approx(8 * 1.11)
    assert t["eval_s"] == pytest.approx(3 * 200 * 0.001)  # one background evaluation: 3 full-length episodes
    assert t["between_evals_s"] == pytest.approx(5 * 1.11) and t["evals_keep_up"]
    assert t["final_eval_s"] == pytest.approx(200 * 0.001)  # background ones overlap training, the final one not
    assert t["total_s"] == pytest.approx(1.5 + 0.22 + 8.88 + 0.2)
    assert t["estimated"] == {} and not t["extrapolated"]
    assert not predict({**PLAN, "eval_episodes": 30}, RATES)["evals_keep_up"]  # 6 s per evaluation, every 5.55 s
    # collector.overlap: the child collects (0.1 s) while this process writes and learns (1.01 s)
    assert predict({**PLAN, "collector_overlap": True}, RATES)["round_s"] == pytest.approx(1.01)


def test_prediction_scales_absent_hardware_by_stated_factors():
    from offpolicy.tools.plan import ESTIMATES, H200_FP32_FLOPS, predict

    plan = {**PLAN, "envs_per_collector": 25_000, "env_steps_per_collector_round": 25_000,
            "env_steps_per_round": 100_000, "engine": "ray", "ray_actors": True, "backend": "envpool",
            "collector_cpus": 8, "collector_gpus": 1, "learner_gpus": 1, "learner_ranks": 4, "learner_backend": "nccl"}
    t = predict(plan, RATES)
    e = {k: v.value for k, v in ESTIMATES.items()}
    gpu = e["gpu_utilisation"] * H200_FP32_FLOPS / RATES["matmul_flops"]
    env_part = (0.01 - 0.002) * 250 * 2 / 8  # per env from batch 100 to 25,000; envpool on 8 cores, not this 2
    policy = max(0.002 * 250 / gpu, e["gpu_forward_floor_s"])
    assert t["collector_step_s"] == pytest.approx(env_part + policy) and t["extrapolated"]
    update = max(0.02 / gpu, e["gpu_update_floor_s"]) + 2 * 1e6 * 3 / 4 / e["nccl_bytes_per_s"] + e["nccl_latency_s"]
    assert t["round_parts_s"]["learn"] == pytest.approx(50 * update)
    assert t["round_parts_s"]["collect"] == pytest.approx(env_part + policy)  # one step of every env per round
    parts = t["round_parts_s"]
    assert t["round_s"] == pytest.approx(sum(parts.values()) * e["ray_round_factor"])
    assert set(t["estimated"]) == {"gpu_utilisation", "gpu_forward_floor_s", "gpu_update_floor_s",
                                   "envpool_core_scaling", "nccl_bytes_per_s", "nccl_latency_s", "ray_round_factor"}
    assert all(v["source"] for v in t["estimated"].values())


def test_env_step_table_only_measures_backends_that_can_run_the_env():
    from offpolicy.tools.plan import available_backends

    assert available_backends(compose_config(["algo=sac"])[0]) == ("gymnasium", "envpool")
    for args in (["algo=dqn", "env=Pong"], ["algo=sac", "env.from_pixels=true"]):
        assert available_backends(compose_config(args)[0]) == ("gymnasium",)  # envpool has no ALE/pixels path here


def test_atari_plan_times_whole_evaluation_games():
    """Atari evaluation plays whole games (to game over or ALE's 108,000-frame cap: 27,000 agent steps at frame skip
    4), not ``eval.max_episode_steps``: the plan bounds an evaluation episode by that."""
    cfg, _ = compose_config(["algo=dqn", "profile=atari", "eval.max_episode_steps=500"])
    assert make_plan(cfg)["eval_max_episode_steps"] == 27_001
