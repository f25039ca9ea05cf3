"""``python -m offpolicy.tools.tune``: Optuna studies of real (tiny) DQN runs on CartPole-v1 in a SQLite database.
One study of two Ray workers (shared by the tests that read it) prunes a trial through the run's clean stop, records
a failed run with its reason and goes on, and leaves no Ray process; a study killed with SIGKILL continues in its
database when started again (its trials failed and run again); the best trial's profile trains; the shipped search
spaces hold; a bad input is one ``error:`` line, exit 2."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import optuna
import pytest
from optuna.trial import TrialState

from offpolicy.algos import ALGOS, algorithm
from offpolicy.config import compose_config
from offpolicy.tools import tune, tuning
from shared.config import ConfigError, run_cli
from tests.proc import run_module, start_module, wait_no_ray

# runs of a few seconds: 16 batches of 128 env steps, evaluated every 512 env steps (one episode), on one thread
RUN = ["algo=dqn", "env=CartPole-v1", "total_env_steps=2048", "collector.env_steps_per_batch=128",
       "collector.prefill_env_steps=256", "optim.batch_size=32", "eval.interval_env_steps=512", "eval.episodes=1",
       "eval.final_episodes=1", "model.hidden=[32,32]", "checkpoint.interval_s=0", "threads=1"]
# A space whose bad trials are known in advance. CartPole's pole falls after 8 steps at the soonest, so an evaluation
# capped at 5 steps returns 5 and any other returns at least 8: the median pruner (one completed trial first) stops
# every capped trial that starts after a completed one. 200 n-step returns do not fit in the 128 steps each batch
# collects: the run refuses that combination (exit 2) and the trial fails with its reason.
SPACE = """
eval:
  max_episode_steps: {type: categorical, choices: [200, 5]}
loss:
  n_steps: {type: categorical, choices: [1, 200]}
optim:
  lr: {type: float, low: 1.0e-4, high: 1.0e-2, log: true}
"""


def _draws(space, seed: int, worker: int, n: int) -> list[dict]:
    """The first ``n`` trials' values worker ``worker`` of a random-sampler study seeded ``seed`` samples (its
    sampler's stream does not depend on the other trials)."""
    study = optuna.create_study(sampler=tuning.make_sampler("random", seed + worker, 0), direction="maximize")
    return [tuning.suggest(study.ask(), space) for _ in range(n)]


def _planned_seed(space) -> int:
    """A seed whose two workers sample this: worker 0 a good trial, then a capped one (pruned: it starts after its
    first trial completed), then a valid one; worker 1 first the refused combination (failed), then valid ones. With
    4 trials asked, worker 0 runs at most 3 and worker 1 at most 4 of them, whatever the order in which they end: 4
    trials with a result, at least one pruned, and 1 failed."""
    def valid(draw):
        return draw["loss.n_steps"] == 1

    for seed in range(10_000):
        first, second = _draws(space, seed, 0, 3), _draws(space, seed, 1, 4)
        if ([d["eval.max_episode_steps"] for d in first[:2]] == [200, 5] and all(map(valid, first))
                and not valid(second[0]) and all(map(valid, second[1:]))):
            return seed
    raise AssertionError("no seed gives the planned trials")


def _load(study_dir, name):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{study_dir / 'study.db'}")


@pytest.fixture(scope="module")
def ray_study(tmp_path_factory):
    """Two Ray workers on the local cluster run a study of 4 trials (random sampler, median pruner after one
    completed trial, from the first evaluation on)."""
    root = tmp_path_factory.mktemp("tune")
    (root / "space.yaml").write_text(SPACE)
    seed = _planned_seed(tune.load_space(str(root / "space.yaml"), "dqn", []))
    start = time.monotonic()
    done = run_module("offpolicy.tools.tune", *RUN, f"seed={seed}", f"space={root / 'space.yaml'}", "trials=4",
                      "workers=2", "backend=ray", "sampler=random", "startup_trials=1", "warmup_steps=0",
                      "name=tiny", f"study_dir={root / 'study'}", timeout=240)
    return SimpleNamespace(dir=root / "study", done=done, wall_s=time.monotonic() - start, root=root)


def test_two_ray_workers_share_a_study_that_prunes_and_records_failures(ray_study):
    done, study_dir = ray_study.done, ray_study.dir
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = _load(study_dir, "tiny").get_trials()
    states = [t.state for t in trials]
    # one numbering for both workers, no trial twice; 4 with a result (as asked) and the failed one beside them
    assert sorted(t.number for t in trials) == list(range(5))
    assert states.count(TrialState.COMPLETE) + states.count(TrialState.PRUNED) == 4
    assert states.count(TrialState.FAIL) == 1 and states.count(TrialState.PRUNED) >= 1
    first = {t.number: t for t in trials}
    assert max(first[0].datetime_start, first[1].datetime_start) < min(first[0].datetime_complete,
                                                                       first[1].datetime_complete)  # side by side
    capped = 0
    for trial in trials:
        run_dir = study_dir / f"trial-{trial.number}"
        assert trial.user_attrs["run_dir"] == str(run_dir)
        if trial.state == TrialState.FAIL:  # the refused combination: the run's own error line, the study went on
            assert trial.params["loss.n_steps"] == 200 and trial.user_attrs["exit_code"] == 2
            assert "error: loss.n_steps=200 is not allowed" in trial.user_attrs["error"]
            continue
        summary = json.loads((run_dir / "summary.json").read_text())
        assert trial.params["loss.n_steps"] == 1 and (run_dir / "checkpoints" / "last.pt").is_file()
        steps = sorted(trial.intermediate_values)
        assert steps == list(range(512, steps[-1] + 1, 512))  # every evaluation, at its env step
        if trial.state == TrialState.PRUNED:  # judged on its last reported evaluation
            assert trial.user_attrs["pruned_at_env_steps"] == steps[-1]
            assert trial.value == trial.intermediate_values[steps[-1]]
            if trial.params["eval.max_episode_steps"] == 5:  # stopped mid-run the way Ctrl-C stops a run
                capped += 1
                assert steps == [512] and trial.value == 5.0 and trial.user_attrs["exit_code"] == 130
                assert summary["status"] == "interrupted" and 512 <= summary["env_steps"] < 2048
        else:  # the run's final evaluation
            assert summary["status"] == "completed" and summary["env_steps"] == 2048 and steps[-1] == 2048
            assert trial.value == summary["eval_return_last"]
            assert trial.value >= (5 if trial.params["eval.max_episode_steps"] == 5 else 8)
    assert capped >= 1
    assert wait_no_ray() == []


def test_the_study_s_outputs(ray_study):
    """A progress bar over the trials and a line per trial; summary.json, the best profile and both plots."""
    done, study_dir = ray_study.done, ray_study.dir
    assert done.returncode == 0
    assert "4/4" in done.stderr and "pruned after its evaluation at 512 env steps (return 5)" in done.stdout
    assert "failed: exit 2: error: loss.n_steps=200 is not allowed" in done.stdout
    summary = json.loads((study_dir / "summary.json").read_text())
    found = _load(study_dir, "tiny")
    assert summary["trials"]["complete"] == sum(t.state == TrialState.COMPLETE for t in found.trials)
    assert summary["best"]["number"] == found.best_trial.number and summary["best"]["value"] == found.best_value
    assert [t["number"] for t in summary["trial_list"]] == list(range(5))
    complete = summary["trials"]["complete"]
    assert complete >= 1  # the first trial with a result: pruning needs a completed one
    for name, needs in (("optimization_history", 1), ("param_importances", 2)):
        png = study_dir / f"{name}.png"
        if complete < needs:  # the median pruner may also stop a good trial that does worse than the completed one
            assert summary["plots"][name] == f"not drawn: it needs 2 completed trials, the study has {complete}"
            continue
        assert summary["plots"][name] == str(png) and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert png.stat().st_size > 10_000
    assert summary["profile"] == str(study_dir / "best.yaml")


def test_the_best_profile_trains(ray_study, tmp_path):
    study_dir = ray_study.dir
    best = _load(study_dir, "tiny").best_trial
    done = run_module("offpolicy.train", "algo=dqn", f"profile={study_dir / 'best.yaml'}",
                      f"run_dir={tmp_path / 'run'}", timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    config = compose_config(["algo=dqn", f"profile={study_dir / 'best.yaml'}"])[0]
    assert config.optim.lr == best.params["optim.lr"] and config.eval.max_episode_steps == 200
    assert config.total_env_steps == 2048 and config.model.hidden == [32, 32]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env_steps"] == 2048


def test_a_study_killed_with_sigkill_continues_in_its_database(tmp_path):
    """SIGKILL of the command while its two workers' trials run: the workers and then the runs stop (each run
    cleanly), the trials stay RUNNING in the database; the same command again marks them failed (their heartbeat
    stopped) and runs their parameters again as new trials, to the study's end."""
    args = [*RUN, "trials=2", "workers=2", "heartbeat_s=1", "name=killed",
            "space.eval=null", "space.loss=null", f"space={tmp_path / 'space.yaml'}", f"study_dir={tmp_path}"]
    (tmp_path / "space.yaml").write_text(SPACE)
    first = start_module("offpolicy.tools.tune", *args, log=tmp_path / "first.log")
    deadline = time.monotonic() + 90
    # both runs are in their loop (a round logged), where a stop is theirs to handle
    while not all((tmp_path / f"trial-{n}" / "logs" / "scalars" / "train" / "return.csv").is_file() for n in (0, 1)):
        assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()
        time.sleep(0.2)
    os.kill(first.pid, signal.SIGKILL)
    first.wait()
    killed = time.monotonic()
    assert [t.state for t in _load(tmp_path, "killed").get_trials()] == [TrialState.RUNNING] * 2
    while not all((tmp_path / f"trial-{n}" / "summary.json").is_file() for n in (0, 1)):
        assert time.monotonic() < killed + 60, "a run outlived its worker"
        time.sleep(0.2)
    for n in (0, 1):  # the kernel's SIGTERM at its worker's death: the run's clean stop
        assert json.loads((tmp_path / f"trial-{n}" / "summary.json").read_text())["status"] == "interrupted"
    time.sleep(max(0.0, killed + 2.5 - time.monotonic()))  # past the grace period of 2 heartbeats
    done = run_module("offpolicy.tools.tune", *args, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    trials = {t.number: t for t in _load(tmp_path, "killed").get_trials()}
    assert sorted(trials) == [0, 1, 2, 3]
    assert [trials[n].state for n in (0, 1)] == [TrialState.FAIL] * 2
    retried = {trials[n].system_attrs["failed_trial"]: trials[n] for n in (2, 3)}
    assert sorted(retried) == [0, 1]
    for n, retry in retried.items():
        assert retry.state in (TrialState.COMPLETE, TrialState.PRUNED) and retry.params == trials[n].params
    assert done.stdout.count("its worker stopped during the run (it runs again)") == 2


# A worker's run, spawned by a thread that ends (the kernel hands the run to the worker's other thread), then the
# worker exits (the run goes to init): two parent deaths. The run counts the SIGTERMs its stop handler sees.
WORKER = """
import subprocess, sys, threading, time
def spawn():
    subprocess.Popen([sys.executable, "-c", sys.argv[1]], stdout=open(sys.argv[2], "w"))
    time.sleep(1.5)  # the run has armed its parent-death signal; this thread's end is the first handing over
threading.Thread(target=spawn).start()
time.sleep(3.0)  # the run has handled the first; the worker's exit is the second handing over
"""
COUNT_SIGTERMS = """
import signal, time
terms = []
signal.signal(signal.SIGTERM, lambda signum, frame: terms.append(signum))
"""
UNTIL_THE_WORKER_IS_GONE = """
deadline = time.monotonic() + 6
while time.monotonic() < deadline:
    time.sleep(0.02)
print(len(terms), flush=True)
"""


def test_a_run_gets_one_sigterm_however_often_its_worker_s_threads_hand_it_over(tmp_path):
    """Each handing over to a new parent sends the parent-death signal again; the run must see one SIGTERM (its clean
    stop), not a second that kills it once it has left its stop handler (a study killed under load lost a summary)."""
    out = tmp_path / "terms.txt"
    run = COUNT_SIGTERMS + tuning.ON_WORKER_DEATH.replace("{parent}", "os.getppid()") + UNTIL_THE_WORKER_IS_GONE
    worker = subprocess.run([sys.executable, "-c", WORKER, run, str(out)], timeout=30)
    assert worker.returncode == 0
    deadline = time.monotonic() + 30
    while not out.read_text().strip():
        assert time.monotonic() < deadline, "the run printed nothing"
        time.sleep(0.2)
    assert out.read_text().split() == ["1"]


@pytest.mark.parametrize("args, message", [
    (["algo=ppo"], "algo='ppo' does not exist"),
    (["sampler=cmaes"], "sampler='cmaes' is not allowed; allowed: tpe, random"),
    (["pruner=hyperband"], "pruner='hyperband' is not allowed; allowed: median, halving, none"),
    (["trials=0"], "trials='0' is not allowed; allowed: an integer >= 1"),
    (["space.optim.lr.low=2"], "space.optim.lr: low=2 >= high=1.0; allowed: low < high"),
    (["space.optim.lrr.type=float", "space.optim.lrr.low=0.1", "space.optim.lrr.high=0.2"],
     "space.optim.lrr: unknown key 'optim.lrr'; did you mean optim.lr"),
    (["space.dqn.eps_end.high=1.5"], "space.dqn.eps_end: dqn.eps_end=1.5 is out of range; allowed: a number >= 0"),
    (["space.optim.lr.type=normal"], "space.optim.lr.type='normal' is not allowed; allowed: float, int, categorical"),
    (["space.optim.lr.choices=[1]"], "space.optim.lr.choices is not a field of a float range"),
    (["space.eval.episodes.type=float", "space.eval.episodes.low=1", "space.eval.episodes.high=5"],
     "space.eval.episodes: a float range for an integer key; allowed: type: int or categorical"),
    (["space.optim.critic_lr.same_as=optim.nope"], "space.optim.critic_lr.same_as='optim.nope' is not allowed"),
    (["optim.lr=0.001"], "optim.lr is both a run key and in the search space"),
    (["run_dir=x"], "run_dir is set by the tool for each trial"),
    (["space=nope.yaml"], "space='nope.yaml' does not exist; allowed: the path of a YAML search space"),
    (["storage=nosuchdb://host/db"], "storage='nosuchdb://host/db' cannot be opened"),
    (["ray_address=auto"], "ray_address is for backend=ray"),
    (["eval.interval_env_steps=0"], "pruner=median needs periodic evaluations"),
])
def test_bad_input_is_one_config_error(tmp_path, args, message):
    with pytest.raises(ConfigError) as info:
        tune.prepare(["algo=dqn", f"study_dir={tmp_path}", *args])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_bad_input_on_the_command_line_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exit_:
        run_cli(tune.main, ["algo=dqn", "space.optim.lr.low=2"])
    assert exit_.value.code == 2 and capsys.readouterr().err.splitlines() == [
        "error: space.optim.lr: low=2 >= high=1.0; allowed: low < high (a fixed value is a run key: optim.lr=2)"]


@pytest.mark.parametrize("algo", ALGOS)
def test_the_shipped_search_spaces_hold(algo):
    """Each algorithm's space names its config keys, and each bound and choice is a value the key allows."""
    cfg, _ = compose_config([f"algo={algo}", f"env={algorithm(algo).smoke_env}"])
    space = tune.load_space(None, algo, [])
    tune.check_space(space, [f"algo={algo}"], cfg)
    assert {p.key for p in space} >= {"optim.lr", "optim.batch_size", "loss.gamma", "model.hidden"}


def test_a_profile_is_also_a_path(tmp_path):
    """``profile=PATH`` (a file outside configs/offpolicy/profile, as the tool writes one) merges that file, and a
    missing one is one error line."""
    path = tmp_path / "mine.yaml"
    path.write_text("extends: smoke\noptim:\n  lr: 0.0123\n")
    cfg, _ = compose_config(["algo=dqn", f"profile={path}"])
    assert cfg.optim.lr == 0.0123 and cfg.total_env_steps == 300 and cfg.profile == str(path)
    with pytest.raises(ConfigError, match="or the path of a YAML file"):
        compose_config(["algo=dqn", f"profile={tmp_path / 'missing.yaml'}"])
