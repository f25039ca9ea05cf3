"""How far the run's config travels: every function of this repository that receives ``cfg`` (the very object
``offpolicy.train.train`` got) as an argument, traced while real runs train.

    python benchmarks/offpolicy_cfg_path.py [runs=dqn-cartpole,sac-pendulum,dqn-atari]

A call is one (calling function -> called function) pair of this repository's code, counted once however often it
runs; the caller is the nearest frame of this repository's code (a call through torchrl or functools counts from
there). A module counts once however many of its functions receive ``cfg``; a re-entry is a call that enters, from
another module, a module ``cfg`` already reached. Only the training process is traced (a Ray actor's code is not).
Each run is a ``profile=smoke`` run of a few rounds; the union of the runs is printed last. Prints JSON lines.
"""
from __future__ import annotations

import functools
import json
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGES = ("a3c", "offpolicy", "shared")
RUNS = {
    "dqn-cartpole": ["algo=dqn", "env=CartPole-v1", "profile=smoke"],
    "sac-pendulum": ["algo=sac", "env=Pendulum-v1", "profile=smoke"],
    "dqn-atari": ["algo=dqn", "env=Pong", "profile=smoke", "loss.n_steps=3", "replay.frames_once=true",
                  "replay.size=400", "collector.prefill_env_steps=200", "total_env_steps=400",
                  "eval.interval_env_steps=0", "eval.final_episodes=0"],
}


def _ours(code) -> str | None:
    """``package/module.py`` for code of this repository's packages, else None."""
    return _module(code.co_filename)


@functools.lru_cache(maxsize=None)
def _module(filename: str) -> str | None:
    try:
        rel = Path(filename).resolve().relative_to(ROOT)
    except ValueError:
        return None
    return str(rel) if rel.parts and rel.parts[0] in PACKAGES else None


def _name(frame) -> str:
    return f"{_ours(frame.f_code)}::{frame.f_code.co_qualname}"


def trace_train(args: list[str]) -> list[tuple[str, str]]:
    """The (caller, callee) pairs in order of first occurrence while ``train`` runs the config of ``args``."""
    from offpolicy.config import compose_config
    from offpolicy.train import train

    with tempfile.TemporaryDirectory() as run_dir:
        cfg, checkpoint = compose_config([*args, f"run_dir={run_dir}", "logger.progress_bar=false"])
        seen: dict[tuple[str, str], None] = {}

        def trace(frame, event, arg):  # called on each Python call; returning None skips its lines
            if _ours(frame.f_code) is None:
                return None
            code = frame.f_code
            n_args = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
            local = frame.f_locals
            values = [local.get(name) for name in code.co_varnames[:n_args]]
            values += [v for name in code.co_varnames[:n_args] for v in
                       (local.get(name) if isinstance(local.get(name), (tuple, dict)) else ())]
            if not any(v is cfg for v in values):
                return None
            caller = frame.f_back
            while caller is not None and _ours(caller.f_code) is None:
                caller = caller.f_back
            seen.setdefault((_name(caller) if caller is not None else "<entry>", _name(frame)), None)
            return None

        threading.settrace(trace)
        sys.settrace(trace)
        try:
            train(cfg, checkpoint)
        finally:
            sys.settrace(None)
            threading.settrace(None)
    return list(seen)


def path_figures(edges: list[tuple[str, str]]) -> dict:
    """Calls, modules and re-entries of a traced path (the first call, into ``train``, is not counted)."""
    edges = [e for e in edges if not e[1].endswith("::train") or not e[1].startswith("offpolicy/train.py")]
    entered: list[str] = ["offpolicy/train.py"]
    reentries = 0
    for caller, callee in edges:
        src, dst = caller.split("::")[0], callee.split("::")[0]
        if src != dst and dst in entered:
            reentries += 1
        if dst not in entered:
            entered.append(dst)
    modules = sorted({callee.split("::")[0] for _, callee in edges})
    return {"calls": len(edges), "modules": len(modules), "reentries": reentries, "module_list": modules,
            "functions": sorted({callee.split("::")[1] + " (" + callee.split("::")[0] + ")" for _, callee in edges})}


def main(argv: list[str]) -> None:
    import subprocess

    args = dict(a.split("=", 1) for a in argv)
    if "one" in args:  # a child process: trace one run (a fresh process each, so imports and caches start cold)
        print(json.dumps(trace_train(RUNS[args["one"]])))
        return
    names = args.get("runs", ",".join(RUNS)).split(",")
    union: dict[tuple[str, str], None] = {}
    for name in names:
        out = subprocess.run([sys.executable, __file__, f"one={name}"], cwd=ROOT, capture_output=True, text=True,
                             check=True)
        edges = [tuple(e) for e in json.loads(out.stdout.strip().splitlines()[-1])]
        union.update(dict.fromkeys(edges))
        figures = path_figures(edges)
        print(json.dumps({"run": name, **{k: v for k, v in figures.items() if k != "functions"}}), flush=True)
    print(json.dumps({"run": "union", **path_figures(list(union))}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
