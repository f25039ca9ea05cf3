"""The README: its config reference names every key of every config file, so it cannot silently fall behind, and the
examples of its "Your own env", "From Python" and "Export a policy" sections run as they are written."""
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))


def _leaf_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for key, value in cfg.items():
        full = f"{prefix}{key}"
        keys += _leaf_keys(value, full + ".") if isinstance(value, DictConfig) else [full]
    return keys


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name in ("config.yaml", "evaluate.yaml", "export.yaml")],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_readme_documents_every_key(path):
    readme = (REPO / "README.md").read_text()
    missing = [k for k in _leaf_keys(OmegaConf.load(path)) if f"`{k}`" not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_readme_test_command_is_the_one_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == "python -m pytest -q" and ci in (REPO / "README.md").read_text()


def readme_blocks(section: str) -> list[tuple[str, str]]:
    """The fenced code blocks ``(language, code)`` of the README section headed ``section``, up to the next heading of
    the same or a higher level (a ``#`` line inside a code block is no heading)."""
    blocks, level, fence, lines = [], None, None, []
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("```"):
            if fence is None:
                fence, lines = line[3:].strip(), []
            else:
                if level is not None:
                    blocks.append((fence, "\n".join(lines) + "\n"))
                fence = None
        elif fence is not None:
            lines.append(line)
        elif (heading := re.match(r"(#+) (.*)", line)):
            if heading.group(2).strip() == section:
                level = len(heading.group(1))
            elif level is not None and len(heading.group(1)) <= level:
                break
    assert level is not None, f"README.md has no section {section!r}"
    return blocks


@pytest.fixture
def forget_my_envs():
    """Drop the README's ``my_envs`` package from this process afterwards (its modules and the ids it registered), so
    that no other test sees it."""
    yield
    import sys

    import gymnasium

    for name in [n for n in sys.modules if n == "my_envs" or n.startswith("my_envs.")]:
        del sys.modules[name]
    gymnasium.registry.pop("Drift-v0", None)


def test_readme_own_env_example_runs(tmp_path, monkeypatch, capsys, forget_my_envs):
    """"Your own env": its module, written where the commands start, is trained on and evaluated (two new processes,
    which import it from the current directory by the name alone), and its error lines are the ones printed."""
    import os
    import subprocess
    import sys

    from shared.config import run_cli

    (module, source), (_, commands), (_, errors) = readme_blocks("Your own env")
    assert module == "python"
    path = tmp_path / re.match(r"# (\S+\.py):", source).group(1)
    path.parent.mkdir()
    path.write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(["bash", "-e", "-c", commands], cwd=tmp_path, capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((tmp_path / "runs" / "drift" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["env"] == "my_envs.drift:Drift-v0"
    assert summary["env_steps"] == 300 and summary["episodes"] == 15  # Drift's 20-step episodes: the env was ours
    evaluation = json.loads((tmp_path / "runs" / "drift" / "evaluation.json").read_text())
    assert evaluation["lengths"] == [20, 20] and evaluation["env"] == "my_envs.drift:Drift-v0"

    monkeypatch.syspath_prepend(str(tmp_path))  # as `python -m` puts the current directory first
    lines = errors.splitlines()
    for command, expected in zip(lines[::2], lines[1::2]):
        module_name, *argv = command.removeprefix("$ python -m ").split()
        main = __import__(module_name, fromlist=["main"]).main
        with pytest.raises(SystemExit) as exit_:
            run_cli(main, argv)
        assert exit_.value.code == 2 and capsys.readouterr().err.strip() == expected


def test_readme_python_example_runs(tmp_path, monkeypatch, capsys):
    """"From Python": its code runs as it is (the sweep's runs under ./runs), each printed summary is its run's
    summary.json, and the bad key prints the CLI's error line."""
    import ast

    [(language, code)] = readme_blocks("From Python")
    assert language == "python" and len(code.splitlines()) <= 12
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "README.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    ran = [line.split() for line in printed if line.split()[0] in ("0.001", "0.0003")]
    assert [r[:3] for r in ran] == [["0.001", "completed", "200"], ["0.0003", "completed", "200"]]
    for lr, *_, eval_return in ran:
        summary = json.loads((tmp_path / "runs" / f"sac-lr{lr}" / "summary.json").read_text())
        assert summary["eval_return_last"] == ast.literal_eval(eval_return)
    assert namespace["summary"] == json.loads((tmp_path / "runs" / "sac-lr0.0003" / "summary.json").read_text())
    assert printed[-1].startswith("error: unknown key 'optim.lrr'; did you mean optim.lr")



def test_the_export_section_s_examples_run(tmp_path, monkeypatch):
    """Every command of the section runs (in-process, from an empty directory: ``python -m module args`` is the
    module's ``main(args)``) and exits 0, then every Python block runs."""
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    blocks = readme_blocks("Export a policy")
    assert [lang for lang, _ in blocks] == ["bash", "python", "python"]
    for lang, code in blocks:
        if lang == "python":
            exec(compile(code, "README.md", "exec"), {})
            continue
        for line in code.splitlines():
            python, dash_m, module, *args = shlex.split(line, comments=True)
            assert (python, dash_m) == ("python", "-m"), line
            assert importlib.import_module(module).main(args) == 0, line
    assert (tmp_path / "runs" / "sac-pendulum" / "export" / "policy.onnx.json").is_file()
