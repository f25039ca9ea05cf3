"""The off-policy engine's structure, checked on its source: the engine seam does not leak (nothing outside
offpolicy/engines/ imports an engine module; engines/base.py is only the interface), the parts are assembled in one
place (offpolicy/builder.py), no two factories share a name, and no module imports itself through others."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = sorted(REPO.glob("offpolicy/**/*.py"))
FACTORIES = {"make_train_env", "make_eval_env", "make_replay_buffer", "make_learner"}


def _module_name(path: Path) -> str:
    """``offpolicy/replay/buffer.py`` -> ``offpolicy.replay.buffer``, ``offpolicy/replay/__init__.py`` ->
    ``offpolicy.replay``."""
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


MODULE_NAMES = {_module_name(path) for path in MODULES}


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _imported_modules(nodes) -> set[str]:
    """The offpolicy modules the import statements among ``nodes`` name: ``from package import module`` the module,
    ``from module import name`` the module."""
    names = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            names.update(f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in MODULE_NAMES
                         else node.module for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names & MODULE_NAMES


def test_only_the_engines_package_imports_an_engine_module():
    engine_modules = {f"offpolicy.engines.{p.stem}" for p in REPO.glob("offpolicy/engines/*.py")} - {
        "offpolicy.engines.__init__", "offpolicy.engines.base"}
    assert engine_modules == {"offpolicy.engines.local", "offpolicy.engines.ray", "offpolicy.engines.ray_collectors"}
    offenders = [f"{path.relative_to(REPO)} imports {sorted(_imported_modules(ast.walk(_tree(path))) & engine_modules)}"
                 for path in MODULES if "engines" not in path.parts
                 and _imported_modules(ast.walk(_tree(path))) & engine_modules]
    assert not offenders, offenders


def test_the_seam_module_holds_only_the_interface():
    tree = _tree(REPO / "offpolicy/engines/base.py")
    defined = sorted(node.name for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef)))
    assert defined == ["Engine", "LearnerLost"]
    from offpolicy.engines import ENGINES, engine_class
    from offpolicy.engines.base import Engine

    for name in ENGINES:  # every engine answers what the planner and the config check ask of its class
        cls = engine_class(name)
        assert issubclass(cls, Engine) and not getattr(cls, "__abstractmethods__", None), name


def test_parts_are_assembled_only_by_the_builder():
    """The factories are called from offpolicy/builder.py only (and their own module); no two modules define
    functions with the same name (the old local and Ray ``make_replay_buffer``)."""
    callers = []
    defined = defaultdict(list)
    for path in MODULES:
        tree = _tree(path)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                defined[node.name].append(str(path.relative_to(REPO)))
        own = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in FACTORIES and name not in own and path.name != "builder.py":
                    callers.append(f"{path.relative_to(REPO)}:{node.lineno} calls {name}")
    assert not callers, callers
    # every algorithm module has its ``build`` (found through the registry), every entry point its ``main``
    same_name = {name: paths for name, paths in defined.items() if len(paths) > 1 and name not in ("build", "main")}
    assert not same_name, same_name


def test_no_module_imports_itself_through_others():
    """The modules are layered: following their imports (those inside functions too: evaluate.py's of run.py closed a
    loop until the counters moved to progress.py) never leads back to a module. The packages above a module are not
    counted, which Python imports before it: a package imports its own modules (offpolicy/replay/__init__.py exports
    buffer.py's names, offpolicy/algos/ imports every algorithm), and ``from offpolicy.algos import networks`` imports
    the module ``networks``."""
    imports = {_module_name(path): _imported_modules(ast.walk(_tree(path))) for path in MODULES}
    cycles, on_path, done = [], [], set()

    def follow(module):
        on_path.append(module)
        for imported in sorted(imports[module]):
            if imported in on_path:
                cycles.append(" -> ".join(on_path[on_path.index(imported):] + [imported]))
            elif imported not in done:
                follow(imported)
        on_path.pop()
        done.add(module)

    for module in sorted(imports):
        if module not in done:
            follow(module)
    assert not cycles, cycles


def test_the_config_reaches_few_modules_from_train():
    """``cfg`` travels from ``offpolicy.train.train`` through at most 26 calls in at most 12 modules, entering a module
    it already reached at most 8 times (issue 39; 22 calls, 5 re-entries when the run came to own its services; 38
    calls in 13 modules before the builder, checkpoint and run modules; one more since the run asks its engine whether
    it spawns children, for the ``__main__`` guard), traced in a real DQN smoke run."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "benchmarks/offpolicy_cfg_path.py", "runs=dqn-cartpole"], cwd=REPO,
                         capture_output=True, text=True, timeout=300, check=True)
    figures = json.loads(out.stdout.strip().splitlines()[0])
    assert figures["run"] == "dqn-cartpole"
    assert 0 < figures["calls"] <= 26 and 0 < figures["modules"] <= 12 and figures["reentries"] <= 8, figures
    assert "offpolicy/builder.py" in figures["module_list"]  # the tracer saw the parts being built


def test_the_env_kind_is_read_off_the_name_only_when_composing():
    """The env's kind (atari, dmc, gymnasium) is decided once, by ``shared.envs.env_kind`` in the config composition
    (offpolicy/config.py; offpolicy/checkpoint.py for a checkpoint older than ``env.kind``), and carried as
    ``cfg.env.kind``: no other off-policy module reads it off the name (``is_atari``, ``is_dmc``, ``"dmc:"``)."""
    readers = []
    for path in MODULES:
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                if name in ("is_atari", "is_dmc") or (
                        name == "env_kind" and path.name not in ("config.py", "checkpoint.py")):
                    readers.append(f"{path.relative_to(REPO)}:{node.lineno} calls {name}")
            if isinstance(node, ast.Constant) and node.value == "dmc:":
                readers.append(f"{path.relative_to(REPO)}:{node.lineno} tests the name for 'dmc:'")
    assert not readers, readers


def test_a_run_looks_its_engine_up_once(tmp_path, monkeypatch):
    """Training looks the engine class up once (the config check asked it before, while composing) and the engine
    closes the training env it was given."""
    import offpolicy.run
    from offpolicy.config import compose_config
    from offpolicy.train import train

    cfg, _ = compose_config(["algo=dqn", "profile=smoke", f"run_dir={tmp_path}", "eval.final_episodes=0",
                             "logger.progress_bar=false"])
    looked_up, closed = [], []
    real = offpolicy.run.engine_class

    def counting(name):
        looked_up.append(name)
        cls = real(name)

        class Recorded(cls):
            def __init__(self, builder, env, *args):
                original = env.close
                env.close = lambda **kwargs: (closed.append(True), original(**kwargs))[1]
                super().__init__(builder, env, *args)
        return Recorded

    monkeypatch.setattr(offpolicy.run, "engine_class", counting)
    assert train(cfg)["status"] == "completed"
    assert looked_up == ["local"] and closed
