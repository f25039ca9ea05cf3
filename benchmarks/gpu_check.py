"""The GPU path of the off-policy engine in a few minutes (a figure, not a test), for a machine with a CUDA device:

1. ``update``: the learner step of SAC, TD3, DDPG and DQN (batch 256, 256x256 MLPs) on the GPU, three ways: eager,
   compiled (``compile.enabled=true``) and compiled + CUDA graphs (``compile.cudagraphs=true``), in ms per step, with
   the compile time and the recompilations after warm-up (0 expected);
2. ``nccl``: a training run whose learner rank runs on the GPU over NCCL (``ray.backend=nccl``, one rank);
3. ``gpu_collectors``: a training run whose two collector actors run their policy on the GPU (half a GPU each);
4. ``nccl_compiled``: the ``nccl`` run with the learner step compiled and replayed as a CUDA graph.

    python benchmarks/gpu_check.py [update] [nccl] [gpu_collectors] [nccl_compiled] [algos=sac,td3,ddpg,dqn]
        [variants=eager,compiled,compiled_cudagraphs]

Each case of ``update`` runs in a process of its own; a failing one prints its traceback to stderr.

Prints JSON lines and appends them to benchmarks/results/gpu_check.jsonl; exits 2 with one line when there is no
CUDA device.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

RUN = ["algo=sac", "env=Pendulum-v1", "profile=ray_smoke", "total_env_steps=4000", "eval.interval_env_steps=0"]
RUNS = {
    "nccl": [*RUN, "ray.backend=nccl", "ray.world_size=1", "ray.learner_gpus=1", "ray.learner_cpus=1"],
    "gpu_collectors": [*RUN, "ray.collector_gpus=0.5", "ray.world_size=1"],
}
# the NCCL rank's step compiled and replayed as a CUDA graph, in a whole run
RUNS["nccl_compiled"] = [*RUNS["nccl"], "compile.enabled=true", "compile.cudagraphs=true"]


def _emit(check: str, metric: str, value, unit: str, out: Path) -> None:
    line = {"bench": f"gpu_check/{check}", "metric": metric, "value": value, "unit": unit,
            "device": torch.cuda.get_device_name(0)}
    print(json.dumps(line), flush=True)
    with out.open("a") as f:
        f.write(json.dumps({**line, "time": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")


UPDATE_ENVS = {"sac": "HalfCheetah-v5", "td3": "HalfCheetah-v5", "ddpg": "HalfCheetah-v5", "dqn": "CartPole-v1"}
# the learner's own switches; CUDA graphs are allowed on a CUDA learner without gradient averaging (one NCCL rank)
VARIANTS = {
    "eager": [],
    "compiled": ["compile.enabled=true"],
    "compiled_cudagraphs": ["compile.enabled=true", "compile.cudagraphs=true", "engine=ray", "ray.backend=nccl",
                            "ray.world_size=1", "ray.learner_gpus=1"],
}


def check_update(out: Path, algos: list[str], variants: list[str]) -> None:
    """Each algorithm's learner step on the GPU: eager, compiled, compiled + CUDA graphs, each in a process of its own
    (a failed CUDA-graph capture leaves the process's CUDA state unusable for the next case)."""
    for algo in algos:
        for variant in variants:
            proc = subprocess.run([sys.executable, __file__, "update_case", algo, variant], cwd=ROOT,
                                  capture_output=True, text=True)
            print(proc.stdout, end="", flush=True)
            if proc.returncode:
                _emit(f"update_{algo}_{variant}", "error", " ".join(proc.stderr.strip().splitlines()[-1:])[:300],
                      "text", out)
                print(proc.stderr[-4000:], file=sys.stderr, flush=True)  # the whole traceback, for the log


def update_case(algo: str, variant: str, out: Path, n: int = 200) -> None:
    """One algorithm's learner step on the GPU, one way: warm-up time, ms per step, recompilations after warm-up."""
    from offpolicy import prepare_process
    from offpolicy.builder import Builder
    from offpolicy.config import compose_config
    from offpolicy.envs import make_train_env
    from offpolicy.learner import make_learner
    from offpolicy.replay import make_replay_buffer

    prepare_process()  # its own process, as every process that runs the engine's code
    device = torch.device("cuda")
    base = [f"algo={algo}", f"env={UPDATE_ENVS[algo]}", "optim.batch_size=256", "model.hidden=[256,256]",
            "collector.env_steps_per_batch=1000"]
    cfg, _ = compose_config([*base, *VARIANTS[variant]])
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    collector = Builder(cfg).collector(env, parts.collect_policy)
    replay = make_replay_buffer(cfg)
    replay.extend(next(iter(collector)).reshape(-1))
    collector.shutdown()
    name = f"update_{algo}_{variant}"
    torch.manual_seed(0)
    parts = Builder(cfg).parts(env)
    parts.loss.to(device)
    learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(256,), device=device)
    start = time.perf_counter()
    learner.update(replay, learner.warmup_steps + 4, version=1)
    torch.cuda.synchronize()
    _emit(name, "warmup_s", round(time.perf_counter() - start, 1), "s", out)
    start = time.perf_counter()
    learner.update(replay, n, version=1)
    torch.cuda.synchronize()
    _emit(name, "ms_per_step", round((time.perf_counter() - start) / n * 1000, 3), "ms", out)
    if learner.recompiles is not None:
        _emit(name, "recompiles", learner.recompiles, "count", out)


def check_run(name: str, out: Path) -> None:
    """A short Ray training run on the GPU path ``name``: exit code, wall time and the summary's counts."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "offpolicy.train", *RUNS[name], f"run_dir={tmp}"], cwd=ROOT,
                              capture_output=True, text=True, timeout=480)
        wall = time.perf_counter() - start
        _emit(name, "exit_code", proc.returncode, "code", out)
        _emit(name, "wall_s", round(wall, 1), "s", out)
        summary = Path(tmp) / "summary.json"
        if summary.exists():
            s = json.loads(summary.read_text())
            for key in ("status", "env_steps", "optim_steps", "policy_version", "eval_return_last",
                        "compile_recompiles"):
                _emit(name, key, s[key], "summary", out)
        if proc.returncode:
            _emit(name, "stderr_tail", proc.stderr[-600:], "text", out)


def main(argv: list[str]) -> int:
    if not torch.cuda.is_available():
        print("error: no CUDA device: the GPU check needs one (see docs/results.md, GPU path)", file=sys.stderr)
        return 2
    out = ROOT / "benchmarks" / "results" / "gpu_check.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    if argv[:1] == ["update_case"]:  # one case of `update`, in its own process
        update_case(argv[1], argv[2], out)
        return 0
    checks = [a for a in argv if "=" not in a] or ["update", "nccl", "gpu_collectors", "nccl_compiled"]
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    algos = options.get("algos", ",".join(UPDATE_ENVS)).split(",")
    variants = options.get("variants", ",".join(VARIANTS)).split(",")
    for check in checks:
        check_update(out, algos, variants) if check == "update" else check_run(check, out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
