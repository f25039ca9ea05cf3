"""The study behind ``python -m offpolicy.tools.tune`` (the command: offpolicy/tools/tune.py): the search space, the
Optuna study on its RDB storage, and the worker that runs its trials. Each trial is a training run of its own
(``python -m offpolicy.train`` in a child process, its own run directory, summary and checkpoint) with the sampled
keys; its periodic evaluations are reported to Optuna as the run logs them, and when the pruner says so the run is
stopped the way Ctrl-C stops it (it finishes its round, saves and writes summary.json). A worker is a function of
picklable settings (:class:`Study`), so the same code runs in the command's process, in local worker processes and as
Ray tasks, all sharing the study through its storage (Optuna's way to share a study).
"""
from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import optuna
from optuna.trial import TrialState

from shared.config import ConfigError, overrides_argv
from shared.logging import read_scalars

KINDS = ("float", "int", "categorical")
FIELDS = {"float": ("low", "high", "log", "step"), "int": ("low", "high", "log", "step"), "categorical": ("choices",)}
SAMPLERS = ("tpe", "random")
PRUNERS = ("median", "halving", "none")
RETRIES = 3  # runs of one trial's parameters after its worker died or was stopped
# trials that count towards ``trials``: those with a result and those running (so that workers together run no more);
# a failed trial does not count (a killed one is run again in its place)
COUNTED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)
POLL_S = 0.2  # how often a trial's evaluations and exit are looked at
# The run's process asks the kernel for a signal when the worker that started it dies (kill -9 included) and turns it
# into one SIGTERM, which the run takes as its clean stop; then it runs offpolicy.train as ``python -m`` would. Why not
# SIGTERM itself: the kernel sends the parent-death signal each time the process is handed to a new parent, first to a
# live thread of the dying worker, then to init when that thread exits too; a second SIGTERM that lands after the run
# has left its stop handlers (its round done, saving) killed it without its summary. So the first signal disarms it.
ON_WORKER_DEATH = """
import ctypes, os, signal, sys
prctl = getattr(ctypes.CDLL(None), 'prctl', lambda *a: 0)
def worker_died(signum, frame):
    prctl(1, 0)  # 1: PR_SET_PDEATHSIG; 0: no signal at the next handing over
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGTERM)
signal.signal(signal.SIGUSR1, worker_died)
prctl(1, signal.SIGUSR1)
os.getppid() == {parent} or sys.exit('error: the tuning worker that started this run is gone')
"""
LAUNCH = ON_WORKER_DEATH + "import runpy; runpy.run_module('offpolicy.train', run_name='__main__', alter_sys=True)\n"


class TrialFailed(Exception):
    """A trial's run ended with an error; the message is the run's ``error:`` line."""


@dataclass(frozen=True)
class Param:
    """One dimension of the search space: the config ``key`` and its range (``kind`` float, int, categorical) or
    ``same_as`` another key of the space."""

    key: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: float | None = None
    choices: tuple = ()
    same_as: str | None = None

    def candidates(self) -> list:
        """The values a run may get (the bounds of a range), to check against the key's rule before the study."""
        return list(self.choices) if self.kind == "categorical" else [self.low, self.high]

    def suggest(self, trial):
        """Optuna's suggestion for this key, as the study records it: a categorical choice that is not a scalar
        (``[64, 64]``) by its JSON text (:meth:`value` turns it back)."""
        if self.kind == "float":
            return trial.suggest_float(self.key, self.low, self.high, log=self.log, step=self.step)
        if self.kind == "int":
            return trial.suggest_int(self.key, int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return trial.suggest_categorical(self.key, [_label(choice) for choice in self.choices])

    def value(self, recorded):
        """The config value of a recorded parameter."""
        if self.kind != "categorical":
            return recorded
        return self.choices[[_label(choice) for choice in self.choices].index(recorded)]

    def describe(self) -> dict:
        """The range as the space file writes it."""
        if self.same_as is not None:
            return {"same_as": self.same_as}
        if self.kind == "categorical":
            return {"type": self.kind, "choices": list(self.choices)}
        extra = {"log": True} if self.log else {}
        return {"type": self.kind, "low": self.low, "high": self.high, **extra,
                **({"step": self.step} if self.step is not None else {})}


def _label(choice):
    return choice if choice is None or isinstance(choice, (bool, int, float, str)) else json.dumps(choice)


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _param(key: str, spec: dict) -> Param:
    """One range of a space file; a ConfigError naming ``space.<key>`` and what is allowed."""
    if "same_as" in spec:
        if set(spec) != {"same_as"} or not isinstance(spec["same_as"], str):
            raise ConfigError(f"space.{key}={spec} is not allowed; allowed: {{same_as: KEY}} alone, KEY another key "
                              "of the space")
        return Param(key, "same_as", same_as=spec["same_as"])
    kind = spec.get("type")
    if kind not in KINDS:
        raise ConfigError(f"space.{key}.type={kind!r} is not allowed; allowed: {', '.join(KINDS)} (or same_as: KEY)")
    unknown = sorted(set(spec) - {"type", *FIELDS[kind]})
    if unknown:
        raise ConfigError(f"space.{key}.{unknown[0]} is not a field of a {kind} range; allowed: "
                          f"{', '.join(FIELDS[kind])}")
    if kind == "categorical":
        choices = spec.get("choices")
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"space.{key}.choices={choices!r} is not allowed; allowed: a non-empty list")
        return Param(key, kind, choices=tuple(choices))
    bounds = {name: spec.get(name) for name in ("low", "high")}
    for name, value in bounds.items():
        if not _number(value) or (kind == "int" and not float(value).is_integer()):
            raise ConfigError(f"space.{key}.{name}={value!r} is not allowed; allowed: "
                              f"{'an integer' if kind == 'int' else 'a number'}")
    low, high = bounds["low"], bounds["high"]
    if not low < high:
        raise ConfigError(f"space.{key}: low={low} >= high={high}; allowed: low < high (a fixed value is a run key: "
                          f"{key}={low})")
    log, step = spec.get("log", False), spec.get("step")
    if not isinstance(log, bool) or (log and low <= 0):
        raise ConfigError(f"space.{key}.log={log!r} is not allowed; allowed: true (with low > 0) or false")
    if step is not None and (not _number(step) or step <= 0 or log):
        raise ConfigError(f"space.{key}.step={step!r} is not allowed; allowed: a positive number, without log")
    return Param(key, kind, low=low, high=high, log=log, step=step)


def parse_space(tree: dict) -> tuple[Param, ...]:
    """The ranges of a search space (nested like the config: ``optim: {lr: {type: float, ...}}``, a range being a
    mapping with ``type`` or ``same_as``; a key set to null is left out), in the file's order."""
    params = []

    def walk(node: dict, prefix: str) -> None:
        for name, value in node.items():
            key = f"{prefix}{name}"
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(f"space.{key}={value!r} is not a range; allowed: {{type: float|int, low, high}}, "
                                  "{type: categorical, choices: [...]} or {same_as: KEY}")
            if "type" in value or "same_as" in value:
                params.append(_param(key, value))
            else:
                walk(value, key + ".")

    walk(tree, "")
    if not any(p.same_as is None for p in params):
        raise ConfigError("the search space has no range; allowed: at least one key with {type: ...}")
    ranged = {p.key for p in params if p.same_as is None}
    for param in params:
        if param.same_as is not None and param.same_as not in ranged:
            raise ConfigError(f"space.{param.key}.same_as={param.same_as!r} is not allowed; allowed: a key of the "
                              f"space with a range ({', '.join(sorted(ranged))})")
    return tuple(params)


def suggest(trial, space: tuple[Param, ...]) -> dict:
    """The trial's value of every key of the space, sampled now."""
    return decode({p.key: p.suggest(trial) for p in space if p.same_as is None}, space)


def decode(params: dict, space: tuple[Param, ...]) -> dict:
    """The config value of every key of the space from a trial's recorded parameters (a ``same_as`` key: its key's
    value)."""
    values = {p.key: p.value(params[p.key]) for p in space if p.same_as is None}
    return {p.key: values[p.same_as or p.key] for p in space}


@dataclass(frozen=True)
class Study:
    """What a worker needs to find the study and run its trials (sent to worker processes and Ray tasks)."""

    name: str
    storage: str
    study_dir: str  # absolute, as workers may start elsewhere
    cwd: str  # where the command runs: the runs start there (relative paths among run_args)
    run_args: tuple[str, ...]  # the runs' fixed keys as key=value words, algo= first
    space: tuple[Param, ...]
    trials: int
    sampler: str
    pruner: str
    seed: int
    startup_trials: int
    warmup_steps: int
    eval_interval: int
    heartbeat_s: int
    worker_cpus: int

    def rdb(self, heartbeat: bool = True):
        """The study's storage: Optuna's RDB storage on the SQLAlchemy URL, with the heartbeat that marks a trial whose
        worker died (kill -9 too) as failed and runs its parameters again (Optuna's retry callback)."""
        quiet_optuna()
        # several processes write one SQLite file: wait for its lock rather than fail at once
        engine = {"connect_args": {"timeout": 60}} if self.storage.startswith("sqlite") else {}
        kwargs = {}
        if heartbeat:
            kwargs = {"heartbeat_interval": self.heartbeat_s, "grace_period": 2 * self.heartbeat_s,
                      "heartbeat_stale_trial_callback": optuna.storages.RetryHeartbeatStaleTrialCallback(RETRIES)}
        return optuna.storages.RDBStorage(self.storage, engine_kwargs=engine, **kwargs)

    def load(self, worker: int = 0, heartbeat: bool = True):
        """The Optuna study with worker ``worker``'s sampler (seeded ``seed + worker``, so workers sample apart) and the
        pruner."""
        return optuna.load_study(study_name=self.name, storage=self.rdb(heartbeat),
                                 sampler=make_sampler(self.sampler, self.seed + worker, self.startup_trials),
                                 pruner=self.make_pruner())

    def make_pruner(self):
        """median: RL Zoo's (``startup_trials`` trials first, none pruned before ``warmup_steps`` env steps); halving:
        RL Zoo's successive halving (reduction factor 4), rungs counted in evaluation intervals; none."""
        from optuna.pruners import MedianPruner, NopPruner, SuccessiveHalvingPruner

        if self.pruner == "median":
            return MedianPruner(n_startup_trials=self.startup_trials, n_warmup_steps=self.warmup_steps)
        if self.pruner == "halving":
            return SuccessiveHalvingPruner(min_resource=self.eval_interval, reduction_factor=4,
                                           min_early_stopping_rate=0)
        return NopPruner()


def make_sampler(kind: str, seed: int, startup_trials: int):
    """TPE as RL Zoo runs it (multivariate, ``startup_trials`` random trials first), with the constant liar so that
    workers do not sample where others are running; or random."""
    from optuna.samplers import RandomSampler, TPESampler

    if kind == "random":
        return RandomSampler(seed=seed)
    return TPESampler(n_startup_trials=startup_trials, seed=seed, multivariate=True, constant_liar=True)


def quiet_optuna() -> None:
    """Optuna's log lines and the warnings of its experimental arguments stay out of the output: the command prints
    one line per trial itself."""
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


def counted(study) -> int:
    """How many of the study's trials count towards ``trials`` (:data:`COUNTED`)."""
    return len(study.get_trials(deepcopy=False, states=COUNTED))


def work(study: Study, worker: int = 0) -> None:
    """One worker: run trials of the study until it holds ``trials`` counted trials, or as many trials whose runs
    failed (so that a space whose combinations all fail ends)."""
    optuna_study = study.load(worker)
    if counted(optuna_study) >= study.trials:
        return

    def stop_when_failing(optuna_study, trial) -> None:
        failed = optuna_study.get_trials(deepcopy=False, states=(TrialState.FAIL,))
        if sum("error" in t.user_attrs for t in failed) >= study.trials:
            optuna_study.stop()

    optuna_study.optimize(partial(objective, study), catch=(TrialFailed,), gc_after_trial=False,
                          callbacks=[optuna.study.MaxTrialsCallback(study.trials, states=COUNTED),
                                     stop_when_failing])


def work_in_child(study: Study, worker: int) -> None:
    """A local worker process: it ends when the command's process does (kill -9 too), and so, in turn, its run."""
    import ctypes

    getattr(ctypes.CDLL(None), "prctl", lambda *a: 0)(1, signal.SIGTERM)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != multiprocessing.parent_process().pid:  # the command died before the request
        return
    try:
        work(study, worker)
    except KeyboardInterrupt:  # Ctrl-C: the trial was stopped and queued again; the command reports
        pass


def objective(study: Study, trial) -> float:
    """One trial: a training run with the sampled keys, its evaluations reported as they are logged; the run's final
    evaluation (its last, if it had none) is the value. Pruned: the run is stopped cleanly. A run that exits with an
    error fails the trial with the run's ``error:`` line (``trial.user_attrs["error"]``). Ctrl-C (or a cancelled Ray
    task) stops the run cleanly and queues the trial's parameters again."""
    values = suggest(trial, study.space)
    run_dir = Path(study.study_dir) / f"trial-{trial.number}"
    run_dir.mkdir(parents=True, exist_ok=True)
    trial.set_user_attr("run_dir", str(run_dir))
    args = [*study.run_args, *overrides_argv(values), f"run_dir={run_dir}", "logger.progress_bar=false"]
    log = run_dir / "train.log"
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-c", LAUNCH.format(parent=os.getpid()), *args], stdout=out,
                                   stderr=subprocess.STDOUT, cwd=study.cwd,
                                   env={**os.environ, "OMP_NUM_THREADS": str(study.worker_cpus)})
    try:
        pruned_at = follow(trial, process, run_dir, study.eval_interval)
        code = process.wait()
    except BaseException:  # Ctrl-C, a cancelled Ray task: the run stops cleanly, its parameters run again later
        stop_run(process)
        stored = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
        optuna.storages.RetryHeartbeatStaleTrialCallback(RETRIES)(trial.study, stored)
        raise
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    for name in ("status", "env_steps", "elapsed_s", "eval_return_last", "eval_return_best"):
        if name in summary:
            trial.set_user_attr(name, summary[name])
    trial.set_user_attr("exit_code", code)
    if pruned_at is not None:
        trial.set_user_attr("pruned_at_env_steps", pruned_at)
        raise optuna.TrialPruned(f"stopped after its evaluation at {pruned_at} env steps")
    if code != 0:
        reason = error_line(log, code)
        trial.set_user_attr("error", reason)
        raise TrialFailed(reason)
    if summary.get("eval_return_last") is None:
        reason = "the run made no evaluation (eval.final_episodes=0 and no periodic one)"
        trial.set_user_attr("error", reason)
        raise TrialFailed(reason)
    return float(summary["eval_return_last"])


def follow(trial, process: subprocess.Popen, run_dir: Path, interval: int) -> int | None:
    """Report each evaluation the run logs (``eval/return`` in its CSV log) to Optuna until the run exits, at its
    env step rounded down to a multiple of ``interval`` (so that runs whose rounds end at other env steps are compared
    at the same steps; a step reported once, as Optuna takes it once). When the pruner says so, stop the run and
    return that step; None when the run ended by itself."""
    reported = set()
    while True:
        ended = process.poll() is not None
        for step, value in zip(*read_scalars(run_dir, "eval/return")):
            step = int(step) // interval * interval if interval else int(step)
            if step in reported:
                continue
            reported.add(step)
            trial.report(value, step)
            if not ended and trial.should_prune():
                stop_run(process)
                return step
        if ended:
            return None
        time.sleep(POLL_S)


def stop_run(process: subprocess.Popen) -> None:
    """Stop a run as Ctrl-C does (it finishes its round, saves its checkpoint and summary) and wait for it."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    process.wait()


def error_line(log: Path, code: int) -> str:
    """Why a run failed: its last ``error:`` line, else the last line it printed, with its exit code."""
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return f"exit {code}: " + (errors[-1] if errors else lines[-1] if lines else "no output")
