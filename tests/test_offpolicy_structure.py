"""The off-policy engine's structure, checked on its source: the engine seam does not leak (nothing outside
offpolicy/engines/ imports an engine module or compares the engine's name; engines/base.py is only the interface),
the parts are assembled in one place (offpolicy/builder.py), no two factories share a name, no module imports itself
through others and no package does (lazy imports counted), and each algorithm is one module and one config file that
nothing else names. How far ``cfg`` travels is measured, not capped: benchmarks/offpolicy_cfg_path.py."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MODULES = sorted(REPO.glob("offpolicy/**/*.py"))
PACKAGES = ("a3c", "offpolicy", "shared")
ALL_MODULES = sorted(path for package in PACKAGES for path in REPO.glob(f"{package}/**/*.py"))
SUBPACKAGES = ("offpolicy.algos", "offpolicy.collect", "offpolicy.engines", "offpolicy.replay", "offpolicy.tools")
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
    assert defined == ["Engine", "LearnerLost", "RunNeeds"]  # the interface, its error and what a run sets up for it
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
    # every algorithm module has its ``build`` (found through the registry), every entry point its ``main``; the
    # Python API's ``train(**overrides)`` (api.py) composes the config that the entry module's ``train(cfg)`` runs
    same_name = {name: paths for name, paths in defined.items() if len(paths) > 1 and name not in ("build", "main")
                 and not (name == "train" and set(paths) == {"offpolicy/api.py", "offpolicy/train.py"})}
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


def _names_the_engine(node: ast.expr) -> bool:
    """``cfg.engine``, ``engine``, ``plan["engine"]``."""
    if isinstance(node, ast.Subscript):
        return isinstance(node.slice, ast.Constant) and node.slice.value == "engine"
    if isinstance(node, ast.Attribute):
        return node.attr == "engine"
    return isinstance(node, ast.Name) and node.id == "engine"


def _engine_names_in(node: ast.expr, names) -> bool:
    """A constant engine name, or a tuple, list or set of them."""
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_engine_names_in(element, names) for element in node.elts)
    return isinstance(node, ast.Constant) and node.value in names


def test_no_engine_name_is_compared_outside_the_engines():
    """What differs by engine is asked of its class (offpolicy/engines/base.py); no module outside offpolicy/engines/
    compares the engine's name (``cfg.engine == "ray"``, ``engine in ("local", ...)``, ``plan["engine"] != ...``)."""
    from offpolicy.engines import ENGINES

    compared = []
    for path in ALL_MODULES:
        if path.parent == REPO / "offpolicy" / "engines":
            continue
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                if any(map(_names_the_engine, operands)) and any(_engine_names_in(o, ENGINES) for o in operands):
                    compared.append(f"{path.relative_to(REPO)}:{node.lineno}: {ast.unparse(node)}")
    assert not compared, compared
    # the check sees what it forbids
    assert _names_the_engine(ast.parse('cfg.engine == "ray"', mode="eval").body.left)
    assert _engine_names_in(ast.parse('("local", "ray")', mode="eval").body, ENGINES)


def _package(module: str) -> str:
    """The node of the package graph a module belongs to: ``a3c``, ``shared``, a subpackage of offpolicy, or the
    module itself for offpolicy's own modules (the package there holds several layers: entry points and the run above
    the engines, the builder, learner and envs below them)."""
    top = module.split(".")[0]
    if top in ("a3c", "shared"):
        return top
    return next((sub for sub in SUBPACKAGES if module == sub or module.startswith(sub + ".")), module)


def _package_imports() -> dict[str, dict[str, list[str]]]:
    """package -> imported package -> where: every import statement of every module of our packages, those inside
    functions too (a lazy import is still a dependency)."""
    known = {_module_name(path) for path in ALL_MODULES}
    graph: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path in ALL_MODULES:
        source = _package(_module_name(path))
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.level == 0, f"{path}: a relative import"
                names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
                         for a in node.names]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            for name in names:
                if name.split(".")[0] in PACKAGES and (target := _package(name)) != source:
                    graph[source][target].append(f"{path.relative_to(REPO)}:{node.lineno}")
    return graph


def _cycles(graph) -> list[str]:
    cycles, on_path, done = [], [], set()

    def follow(node):
        on_path.append(node)
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                cycles.append(" -> ".join(on_path[on_path.index(target):] + [target]))
            elif target not in done:
                follow(target)
        on_path.pop()
        done.add(node)

    for node in sorted(graph):
        if node not in done:
            follow(node)
    return cycles


def test_no_package_imports_itself_through_others():
    """The packages are layered, lazy imports counted: shared below both engines, a3c and the off-policy packages
    apart, and within offpolicy no cycle between its subpackages and its own modules."""
    graph = _package_imports()
    assert "offpolicy" not in {target.split(".")[0] for target in graph["shared"]}, dict(graph["shared"])
    assert "a3c" not in {target.split(".")[0] for target in graph["shared"]}, dict(graph["shared"])
    assert not any(t.startswith("a3c") for s in graph if s.startswith("offpolicy") for t in graph[s])
    assert not _cycles(graph), _cycles(graph)
    assert _cycles({"a": {"b": []}, "b": {"a": []}}) == ["a -> b -> a"]  # the check sees a cycle


def test_each_algorithm_is_one_module_and_one_config_file():
    """An algorithm is offpolicy/algos/<name>.py (declaring ``ALGORITHM``) and configs/offpolicy/algo/<name>.yaml:
    the registry finds exactly those; no other module names an algorithm (a string ``"dqn"``, a key of its section
    ``"dqn.eps_end"``, ``cfg.dqn``) except the registry's default and the checkpoint migrations of keys renamed in old
    checkpoints; tools take what they need from the declarations (smoke envs, action kinds)."""
    import importlib

    from offpolicy.algos import ALGORITHMS

    modules = {p.stem for p in (REPO / "offpolicy/algos").glob("*.py")} - {"__init__"}
    assert modules - set(ALGORITHMS) == {"base", "networks", "policies"}  # what every algorithm shares
    assert {p.stem for p in (REPO / "configs/offpolicy/algo").glob("*.yaml")} == set(ALGORITHMS)
    for name, algo in ALGORITHMS.items():
        assert algo.name == name and importlib.import_module(f"offpolicy.algos.{name}").ALGORITHM is algo
    allowed = {REPO / "offpolicy/algos/__init__.py": "DEFAULT_ALGO", REPO / "offpolicy/checkpoint.py": "migrations"}
    named = []
    for path in ALL_MODULES:
        own = path.stem if path.parent == REPO / "offpolicy" / "algos" else None
        for node in ast.walk(_tree(path)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                word = node.value.split(".")[0] if "." in node.value and " " not in node.value else node.value
            elif isinstance(node, ast.Attribute):
                word = node.attr
            else:
                continue
            if word in ALGORITHMS and word != own:
                named.append((path, f"{path.relative_to(REPO)}:{node.lineno} names {word!r}"))
    unexpected = [where for path, where in named if path not in allowed]
    assert not unexpected, unexpected
    assert any(path == REPO / "offpolicy/algos/__init__.py" for path, _ in named)  # the check sees a name
