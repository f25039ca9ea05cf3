"""``python -m offpolicy.tools.tune algo=NAME [env=ID] [trials=20] [workers=1] [backend=local|ray] [key=value ...]``:
tune an algorithm's hyper-parameters the way RL Baselines3 Zoo's ``--optimize`` does, with Optuna.

Each trial is a training run (``python -m offpolicy.train``; its own run directory ``<study_dir>/trial-<n>`` with its
config, log, checkpoint and summary) of the keys sampled from the search space; its periodic evaluations are reported
to Optuna as the run logs them, and a trial the pruner judges bad is stopped as Ctrl-C stops a run. The value is the
run's final evaluation (``eval_return_last``). The study lives in Optuna's RDB storage (SQLite at
``<study_dir>/study.db`` by default, any SQLAlchemy URL with ``storage=``): the same command again continues it, and
``workers=K`` processes, Ray tasks (``backend=ray``) or commands on other machines with the same storage share it.
At the end: ``best.yaml`` (the best trial's keys as a profile: ``python -m offpolicy.train algo=NAME
profile=<study_dir>/best.yaml``), ``optimization_history.png``, ``param_importances.png`` and ``summary.json``.

Options (every other ``key=value`` is a run key given to every trial, as on ``offpolicy.train``'s command line):
  trials=20            trials of the study with a result or running, all workers together (failed ones do not count)
  workers=1            trials run at once, each worker a process (or a Ray task) running Optuna's optimize loop
  backend=local        local: worker processes on this machine | ray: Ray tasks on a local Ray (127.0.0.1, no
                       dashboard) or on the cluster at ray_address=auto|host:port
  worker_cpus=N        CPUs a worker's run computes on (OMP_NUM_THREADS; a Ray task reserves them); default: this
                       machine's CPUs / workers
  sampler=tpe          tpe (multivariate, startup_trials random trials first) | random
  pruner=median        median (none pruned in the first startup_trials trials nor before warmup_steps env steps) |
                       halving (successive halving, reduction factor 4, rungs of eval.interval_env_steps) | none
  startup_trials=5     warmup_steps=<total_env_steps / 3>
  name=<algo>-<env>    the study's name in the storage; study_dir=runs/tune-<name>;
                       storage=sqlite:///<study_dir>/study.db
  space=configs/offpolicy/tune/<algo>.yaml   the search space; space.KEY.FIELD=VALUE changes one range
                       (space.optim.lr.high=0.01), space.KEY=null leaves a key out
  heartbeat_s=60       a trial whose worker stopped beating for 2 x heartbeat_s (killed) is failed and run again
  seed=0               a run key (every trial's seed) that also seeds the sampler (worker k: seed + k)
"""
from __future__ import annotations

import importlib.util
import json
import multiprocessing
import os
import re
import sys
import threading
import time
from pathlib import Path

from omegaconf import OmegaConf
from tqdm import tqdm

from shared.config import CONFIG_ROOT, ConfigError, ensure_writable_dir, overrides_argv, parse_overrides, run_cli
from shared.files import atomic_write, atomic_write_text
from shared.ray_start import init_ray

# The engine's modules (torch, torchrl) are imported where they are used: a local worker process starts by importing
# this module again (multiprocessing's spawn) and needs none of them.
USAGE = ("usage: python -m offpolicy.tools.tune algo=NAME [env=ID] [trials=N] [workers=K] [backend=local|ray] "
         "[sampler=tpe|random] [pruner=median|halving|none] [space=PATH] [space.KEY.FIELD=V] [name=NAME] "
         "[storage=URL] [key=value ...]")
SPACES = CONFIG_ROOT / "offpolicy" / "tune"
OPTIONS = ("trials", "workers", "backend", "ray_address", "worker_cpus", "sampler", "pruner", "startup_trials",
           "warmup_steps", "name", "study_dir", "storage", "space", "heartbeat_s")
SET_BY_THE_TOOL = ("run_dir", "resume", "logger.progress_bar")
BACKENDS = ("local", "ray")


def _parse(argv: list[str]) -> tuple[dict, list[str], list[str]]:
    """The tool's options, the search-space changes (``space.`` removed) and the run keys."""
    options, space_words, run_words = {}, [], []
    for arg in argv:
        key, sep, value = arg.partition("=")
        if not sep or not key:
            raise ConfigError(f"argument {arg!r} is not of the form key=value; {USAGE}")
        if key in OPTIONS:
            options[key] = value
        elif key.startswith("space."):
            space_words.append(arg.removeprefix("space."))
        elif key in SET_BY_THE_TOOL:
            raise ConfigError(f"{key} is set by the tool for each trial; allowed: study_dir=PATH (trial n runs in "
                              "<study_dir>/trial-<n>) and the other run keys")
        else:
            run_words.append(arg)
    return options, space_words, run_words


def _int(options: dict, key: str, default: int, low: int) -> int:
    raw = options.get(key)
    if raw is None:
        return default
    if not re.fullmatch(r"\d+", raw) or int(raw) < low:
        raise ConfigError(f"{key}={raw!r} is not allowed; allowed: an integer >= {low}")
    return int(raw)


def _choice(options: dict, key: str, allowed: tuple[str, ...]) -> str:
    value = options.get(key, allowed[0])
    if value not in allowed:
        raise ConfigError(f"{key}={value!r} is not allowed; allowed: {', '.join(allowed)}")
    return value


def load_space(path: str | None, algo: str, changes: list[str]):
    """The search space: the file (the algorithm's own by default) with the command line's changes."""
    from offpolicy.tools.tuning import parse_space

    shipped = sorted(p.stem for p in SPACES.glob("*.yaml"))
    file = Path(path) if path else SPACES / f"{algo}.yaml"
    if not file.is_file():
        raise ConfigError(f"space={str(file)!r} does not exist; allowed: the path of a YAML search space (shipped in "
                          f"configs/offpolicy/tune/: {', '.join(shipped)})")
    try:
        tree = OmegaConf.merge(OmegaConf.load(file), OmegaConf.from_dotlist(changes))  # SafeLoader, as config files
    except Exception as exc:  # omegaconf and yaml raise several types for a malformed file or change
        raise ConfigError(f"space={str(file)!r} with {changes} cannot be read ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}); allowed: a YAML mapping of config keys to ranges") from None
    return parse_space(OmegaConf.to_container(tree))


def check_space(space, run_words: list[str], cfg) -> None:
    """Every key of the space is a config key that is not also a fixed run key, and each bound and choice is a value
    the key allows on its own (the checks across keys are the runs': a trial of a combination they refuse fails with
    their reason). An integer key takes an int range or choices, not a float range."""
    from offpolicy.config import ALIASES, CONFIG_DIR, GROUPS, defaults, rules
    from shared.config import compose

    fixed = parse_overrides(run_words, ALIASES)
    ranged = {p.key: p for p in space}
    taken = sorted(fixed.keys() & ranged.keys())
    if taken:
        raise ConfigError(f"{taken[0]} is both a run key and in the search space; allowed: one of them "
                          f"(space.{taken[0]}=null leaves it out of the space)")
    candidates = {p.key: ranged[p.same_as or p.key].candidates() for p in space}

    def compose_with(values: dict) -> None:
        compose(defaults(cfg.algo), {**fixed, **parse_overrides(overrides_argv(values))}, config_dir=CONFIG_DIR,
                groups=GROUPS, rules=rules(cfg.algo))

    # the rules of single keys do not interact: one config holds the i-th candidate of every key
    for i in range(max(map(len, candidates.values()))):
        try:
            compose_with({key: values[min(i, len(values) - 1)] for key, values in candidates.items()})
        except ConfigError:  # which key: each on its own
            for key, values in candidates.items():
                for value in values:
                    try:
                        compose_with({key: value})
                    except ConfigError as exc:
                        raise ConfigError(f"space.{key}: {exc}") from None
            raise
    for param in space:
        default = OmegaConf.select(cfg, param.key)
        if ranged[param.same_as or param.key].kind == "float" and isinstance(default, int) \
                and not isinstance(default, bool):
            raise ConfigError(f"space.{param.key}: a float range for an integer key; allowed: type: int or "
                              "categorical")


def prepare(argv: list[str]):
    """Every input checked (the run keys by composing a run's config), the study created or found in its storage;
    returns ``(Study, workers, backend, ray_address, Optuna study)``."""
    from offpolicy.config import compose_config
    from offpolicy.tools import tuning

    options, space_words, run_words = _parse(argv)
    backend = _choice(options, "backend", BACKENDS)
    if "ray_address" in options and backend != "ray":
        raise ConfigError("ray_address is for backend=ray; allowed: backend=ray ray_address=auto|host:port")
    workers, trials = _int(options, "workers", 1, 1), _int(options, "trials", 20, 1)
    sampler, pruner = _choice(options, "sampler", tuning.SAMPLERS), _choice(options, "pruner", tuning.PRUNERS)
    cfg, _ = compose_config(run_words)
    if pruner != "none" and not cfg.eval.interval_env_steps:
        raise ConfigError(f"pruner={pruner} needs periodic evaluations; allowed: eval.interval_env_steps > 0, or "
                          "pruner=none")
    space = load_space(options.get("space"), cfg.algo, space_words)
    check_space(space, run_words, cfg)
    run_args = (f"algo={cfg.algo}", *(w for w in run_words if not w.startswith("algo=")))
    name = options.get("name") or re.sub(r"[/\\:\s]+", "-", f"{cfg.algo}-{cfg.env.name}")
    study_dir = ensure_writable_dir(options.get("study_dir") or f"runs/tune-{name}", "study_dir").resolve()
    storage = options.get("storage") or f"sqlite:///{study_dir / 'study.db'}"
    if storage.startswith("sqlite:///") and not storage.startswith("sqlite:////"):  # workers may start elsewhere
        storage = f"sqlite:///{Path(storage.removeprefix('sqlite:///')).resolve()}"
    study = tuning.Study(
        name=name, storage=storage, study_dir=str(study_dir), cwd=os.getcwd(), run_args=run_args, space=space,
        trials=trials, sampler=sampler, pruner=pruner,
        seed=int(cfg.seed), startup_trials=_int(options, "startup_trials", 5, 0),
        warmup_steps=_int(options, "warmup_steps", cfg.total_env_steps // 3, 0),
        eval_interval=int(cfg.eval.interval_env_steps), heartbeat_s=_int(options, "heartbeat_s", 60, 1),
        worker_cpus=_int(options, "worker_cpus", max(1, (os.cpu_count() or 1) // workers), 1))
    return study, workers, backend, options.get("ray_address"), open_study(study)


def open_study(study):
    """Create the study in its storage, or find it there (``load_if_exists``): one made with other run keys or
    another space is refused rather than mixed."""
    import optuna
    import sqlalchemy.exc

    try:
        found = optuna.create_study(study_name=study.name, storage=study.rdb(), direction="maximize",
                                    load_if_exists=True)
    except (ImportError, sqlalchemy.exc.SQLAlchemyError, ValueError) as exc:
        raise ConfigError(f"storage={study.storage!r} cannot be opened ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0]}); allowed: a SQLAlchemy URL such as "
                          "sqlite:///runs/tune-NAME/study.db or postgresql://user:password@host/db") from None
    settings = json.loads(json.dumps({"run_args": list(study.run_args),
                                      "space": {p.key: p.describe() for p in study.space}}))
    recorded = found.user_attrs.get("settings")
    if recorded is None:
        found.set_user_attr("settings", settings)
    elif recorded != settings:
        what = next(k for k in settings if recorded.get(k) != settings[k])
        raise ConfigError(f"name={study.name!r} in {study.storage} is a study of other {what} ({recorded[what]}); "
                          "allowed: the same run keys and space to continue it, or another name=")
    return found


class Monitor(threading.Thread):
    """A progress bar over the study's trials (those with a result) and one line per trial as it ends, read from the
    storage, so it sees every worker's trials."""

    def __init__(self, study):
        super().__init__(daemon=True, name="tune-monitor")
        self.study = study.load(heartbeat=False)
        self.space, self.total = study.space, study.trials
        self.stopped = threading.Event()
        self.seen = {t.number for t in self.study.get_trials(deepcopy=False) if t.state.is_finished()}
        self.bar = None

    def start(self) -> None:
        self.bar = tqdm(total=self.total, initial=len(self._with_result(self.study.get_trials(deepcopy=False))),
                        unit="trial", dynamic_ncols=True)
        super().start()

    @staticmethod
    def _with_result(trials) -> list:
        from optuna.trial import TrialState

        return [t for t in trials if t.state in (TrialState.COMPLETE, TrialState.PRUNED)]

    def run(self) -> None:
        while not self.stopped.wait(1.0):
            self.poll()

    def poll(self) -> None:
        from optuna.trial import TrialState

        trials = self.study.get_trials(deepcopy=False)
        for trial in trials:
            if trial.state.is_finished() and trial.number not in self.seen:
                self.seen.add(trial.number)
                self.bar.write(trial_line(trial, self.space), file=sys.stdout)
        self.bar.n = len(self._with_result(trials))
        values = [t.value for t in trials if t.state == TrialState.COMPLETE]
        failed = sum(t.state == TrialState.FAIL for t in trials)
        self.bar.set_postfix_str((f"best={max(values):g}" if values else "") + (f" failed={failed}" if failed else ""))

    def close(self) -> None:
        self.stopped.set()
        self.join()
        self.poll()
        self.bar.close()
        sys.stdout.flush()


def _params_text(trial, space) -> str:
    from offpolicy.tools.tuning import decode

    if not trial.params:
        return ""
    values = decode(trial.params, space)
    return " (" + ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()) + ")"


def trial_line(trial, space) -> str:
    """One finished trial: its value, where it was pruned, or why it failed, and its keys."""
    from optuna.trial import TrialState

    if trial.state == TrialState.COMPLETE:
        what = f"evaluation return {trial.value:g}"
    elif trial.state == TrialState.PRUNED:
        what = (f"pruned after its evaluation at {trial.user_attrs.get('pruned_at_env_steps', 0):,} env steps "
                f"(return {trial.value:g})")
    else:
        what = "failed: " + trial.user_attrs.get("error", "its worker stopped during the run (it runs again)")
    return f"trial {trial.number}: {what}{_params_text(trial, space)}"


def run_workers(study, workers: int, backend: str, ray_address: str | None) -> None:
    """Run the study's workers to the end: in this process (one local worker), in worker processes, or as Ray tasks.
    Ctrl-C: each worker stops its run cleanly and queues its trial again; KeyboardInterrupt is raised here after."""
    from offpolicy.tools import tuning

    if backend == "ray":
        init_ray(ray_address, address_key="ray_address", needed_by="backend=ray", instead="backend=local")
        import ray  # installed: init_ray said so

        try:
            task = ray.remote(num_cpus=study.worker_cpus, max_retries=0)(tuning.work)
            refs = [task.remote(study, worker) for worker in range(workers)]
            try:
                ray.get(refs)
            except KeyboardInterrupt:
                for ref in refs:
                    ray.cancel(ref)  # a KeyboardInterrupt in the task: its run stops cleanly
                ray.wait(refs, num_returns=len(refs), timeout=600)
                raise
        finally:
            ray.shutdown()
    elif workers == 1:
        tuning.work(study)
    else:
        spawn = multiprocessing.get_context("spawn")
        processes = [spawn.Process(target=tuning.work_in_child, args=(study, worker), name=f"tune-worker-{worker}")
                     for worker in range(workers)]
        for process in processes:
            process.start()
        try:
            for process in processes:
                process.join()
        except KeyboardInterrupt:  # the workers had it too (one process group): wait for their runs to stop
            for process in processes:
                process.join()
            raise


def plot(found, out: Path) -> dict:
    """Optuna's optimisation history and parameter importances (its matplotlib plots) as PNGs; where one cannot be
    drawn yet (too few completed trials), the reason instead of its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.trial import TrialState
    from optuna.visualization import matplotlib as optuna_plots

    drawn = {}
    complete = len(found.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    for name, draw, needs in (("optimization_history", optuna_plots.plot_optimization_history, 1),
                              ("param_importances", optuna_plots.plot_param_importances, 2)):
        if complete < needs:
            drawn[name] = f"not drawn: it needs {needs} completed trials, the study has {complete}"
            continue
        try:
            ax = draw(found)
        except (ValueError, RuntimeError) as exc:
            drawn[name] = f"not drawn: {str(exc).splitlines()[0]}"
            continue
        fig = ax.figure
        fig.set_size_inches(8, 4.5)
        fig.tight_layout()
        with atomic_write(out / f"{name}.png") as f:
            fig.savefig(f, format="png", dpi=110)
        plt.close(fig)
        drawn[name] = str(out / f"{name}.png")
    return drawn


def write_profile(path: Path, study, best) -> Path:
    """The best trial's keys as a profile of ``offpolicy.train``: the study's run keys (its ``profile=`` as
    ``extends``) and the trial's sampled values; the algorithm stays on the command line."""
    from offpolicy.config import ALIASES
    from offpolicy.tools.tuning import decode

    fixed = parse_overrides(study.run_args[1:], ALIASES)  # run_args[0] is algo=
    extends = fixed.pop("profile", None)
    words = [f"{k}={v}" for k, v in fixed.items()] + overrides_argv(decode(best.params, study.space))
    tree = OmegaConf.to_container(OmegaConf.from_dotlist(words))
    algo = study.run_args[0].partition("=")[2]
    header = (f"# The best trial (number {best.number}, evaluation return {best.value:g}) of the study {study.name!r}\n"
              f"# in {study.storage}: the study's run keys and the trial's sampled values. Train with it:\n"
              f"#   python -m offpolicy.train algo={algo} profile={path}\n")
    return atomic_write_text(path, header + OmegaConf.to_yaml({**({"extends": extends} if extends else {}), **tree}))


def trial_record(trial, space) -> dict:
    """A trial as summary.json lists it."""
    from offpolicy.tools.tuning import decode

    span = (trial.datetime_complete - trial.datetime_start).total_seconds() \
        if trial.datetime_complete and trial.datetime_start else None
    return {"number": trial.number, "state": trial.state.name.lower(), "value": trial.value,
            "params": decode(trial.params, space) if trial.params else {},
            "retry_of": trial.system_attrs.get("failed_trial"), "wall_s": span, **trial.user_attrs}


def write_outputs(study, wall_s: float) -> dict:
    """``summary.json`` (every trial, the counts, the best trial), ``best.yaml`` and the plots, in the study dir."""
    from optuna.trial import TrialState

    found = study.load(heartbeat=False)
    trials = found.get_trials(deepcopy=False)
    out = Path(study.study_dir)
    counts = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    starts = [t.datetime_start for t in trials if t.datetime_start]
    ends = [t.datetime_complete for t in trials if t.datetime_complete]
    summary = {"name": study.name, "storage": study.storage, "run_args": list(study.run_args),
               "space": {p.key: p.describe() for p in study.space}, "sampler": study.sampler, "pruner": study.pruner,
               "trials_asked": study.trials, "trials": counts, "command_wall_s": round(wall_s, 1),
               "study_span_s": round((max(ends) - min(starts)).total_seconds(), 1) if starts and ends else None,
               "best": None, "profile": None, "plots": plot(found, out),
               "trial_list": [trial_record(t, study.space) for t in trials]}
    if complete:
        best = found.best_trial
        summary["best"] = trial_record(best, study.space)
        summary["profile"] = str(write_profile(out / "best.yaml", study, best))
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, default=str))
    return summary


def main(argv: list[str]) -> int:
    """CLI: check the inputs, run the study's workers (a progress bar and a line per trial), write the outputs; exit
    0 when a trial completed, 1 when none did, 130 after Ctrl-C."""
    if any(a in ("-h", "--help", "help") for a in argv):
        print(__doc__.strip() + "\n\n" + USAGE)
        return 0
    if importlib.util.find_spec("optuna") is None:
        raise ConfigError("offpolicy.tools.tune needs Optuna; allowed: pip install -e '.[tune]'")
    import optuna

    from offpolicy.tools import tuning

    start = time.monotonic()
    study, workers, backend, ray_address, found = prepare(argv)
    monitor = Monitor(study)  # before the trials of killed workers fail below, so that their lines are printed
    optuna.storages.fail_stale_trials(study.load())  # failed, and queued to run again
    remaining = study.trials - tuning.counted(found)
    print(f"study {study.name!r} in {study.storage}: {len(found.trials)} trials so far; "
          + (f"{remaining} more on {min(workers, remaining)} {backend} worker{'s' if workers > 1 else ''}, "
             f"trial runs in {study.study_dir}" if remaining > 0 else f"it has its {study.trials} trials"), flush=True)
    interrupted = False
    if remaining > 0:
        monitor.start()
        try:
            run_workers(study, min(workers, remaining), backend, ray_address)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            monitor.close()
    summary = write_outputs(study, time.monotonic() - start)
    counts = summary["trials"]
    print(f"study {study.name!r}: {counts['complete']} completed, {counts['pruned']} pruned, {counts['fail']} failed "
          f"in {summary['command_wall_s']:.0f} s"
          + (f"; best: trial {summary['best']['number']}, evaluation return {summary['best']['value']:g}; profile: "
             f"{summary['profile']}" if summary["best"] else "; no trial completed")
          + f"; summary: {Path(study.study_dir) / 'summary.json'}", flush=True)
    if interrupted:
        print("interrupted: the same command continues the study", flush=True)
        return 130
    return 0 if summary["best"] else 1


if __name__ == "__main__":
    run_cli(main)
