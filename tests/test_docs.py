"""The README and docs/: the config reference (docs/config.md) names every key of every config file, so it cannot
silently fall behind; the examples of docs/usage.md run as they are written and print the error lines it shows; the loop
quoted in docs/offpolicy.md is the one in offpolicy/loop.py; and every relative link and image points to something
that exists."""
import importlib
import json
import re
import shlex
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig, OmegaConf

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
USAGE = REPO / "docs" / "usage.md"
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def _leaf_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for key, value in cfg.items():
        full = f"{prefix}{key}"
        keys += _leaf_keys(value, full + ".") if isinstance(value, DictConfig) else [full]
    return keys


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name in ("config.yaml", "evaluate.yaml", "export.yaml")],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_config_reference_documents_every_key(path):
    reference = (REPO / "docs" / "config.md").read_text()
    missing = [k for k in _leaf_keys(OmegaConf.load(path)) if f"`{k}`" not in reference]
    assert not missing, f"docs/config.md does not document {missing}"


def test_readme_test_command_is_the_one_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == "python -m pytest -q" and ci in (REPO / "README.md").read_text()


def doc_blocks(page: Path, section: str) -> list[tuple[str, str]]:
    """The fenced code blocks ``(language, code)`` of the section headed ``section`` of the Markdown file ``page``, up to
    the next heading of the same or a higher level (a ``#`` line inside a code block is no heading)."""
    blocks, level, fence, lines = [], None, None, []
    for line in page.read_text().splitlines():
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
    assert level is not None, f"{page.name} has no section {section!r}"
    return blocks


def assert_error_lines(transcript: str, capsys) -> None:
    """Each ``$ python -m module args`` line of ``transcript`` exits with code 2 and prints the line after it to stderr
    (``...`` in a printed line stands for text left out, as the docs shorten long lists)."""
    from shared.config import run_cli

    lines = transcript.splitlines()
    assert lines and len(lines) % 2 == 0
    for command, expected in zip(lines[::2], lines[1::2]):
        module_name, *argv = command.removeprefix("$ python -m ").split()
        main = __import__(module_name, fromlist=["main"]).main
        with pytest.raises(SystemExit) as exit_:
            run_cli(main, argv)
        printed = capsys.readouterr().err.strip()
        pattern = ".*?".join(re.escape(part) for part in expected.split("..."))
        assert exit_.value.code == 2 and re.fullmatch(pattern, printed), (command, printed)


@pytest.fixture
def forget_my_envs():
    """Drop docs/usage.md's ``my_envs`` package from this process afterwards (its modules and the ids it registered), so
    that no other test sees it."""
    yield
    import sys

    import gymnasium

    for name in [n for n in sys.modules if n == "my_envs" or n.startswith("my_envs.")]:
        del sys.modules[name]
    gymnasium.registry.pop("Drift-v0", None)


def test_own_env_example_runs(tmp_path, monkeypatch, capsys, forget_my_envs):
    """"Your own env": its module, written where the commands start, is trained on and evaluated (two new processes,
    which import it from the current directory by the name alone), and its error lines are the ones printed."""
    import os
    import subprocess

    (module, source), (_, commands), (_, errors) = doc_blocks(USAGE, "Your own env")
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
    assert_error_lines(errors, capsys)


def test_running_section_s_error_lines_are_the_ones_printed(capsys):
    """"Running": a bad value is the one ``error:`` line shown, exit code 2."""
    [(language, transcript)] = doc_blocks(USAGE, "Running")
    assert language == "text"
    assert_error_lines(transcript, capsys)


def test_python_example_runs(tmp_path, monkeypatch, capsys):
    """"From Python": its code runs as it is (the sweep's runs under ./runs), each printed summary is its run's
    summary.json, and the bad key prints the CLI's error line."""
    import ast

    [(language, code)] = doc_blocks(USAGE, "From Python")
    assert language == "python" and len(code.splitlines()) <= 12
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "docs/usage.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    ran = [line.split() for line in printed if line.split()[0] in ("0.001", "0.0003")]
    assert [r[:3] for r in ran] == [["0.001", "completed", "200"], ["0.0003", "completed", "200"]]
    for lr, *_, eval_return in ran:
        summary = json.loads((tmp_path / "runs" / f"sac-lr{lr}" / "summary.json").read_text())
        assert summary["eval_return_last"] == ast.literal_eval(eval_return)
    assert namespace["summary"] == json.loads((tmp_path / "runs" / "sac-lr0.0003" / "summary.json").read_text())
    assert printed[-1].startswith("error: unknown key 'optim.lrr'; did you mean optim.lr")


def test_the_evaluate_from_python_example_runs(tmp_path, monkeypatch, capsys):
    """"Evaluate a checkpoint from Python": the code runs as it is; its env standardises observations with the
    checkpoint's statistics (what ``Builder(cfg).eval_env()`` alone would drop), and it played two whole episodes."""
    from torchrl.envs import ObservationNorm

    [(language, code)] = doc_blocks(USAGE, "Evaluate a checkpoint from Python")
    assert language == "python"
    monkeypatch.chdir(tmp_path)
    namespace = {}
    exec(compile(code, "docs/usage.md", "exec"), namespace)
    [norm] = [t for t in namespace["env"].transform if isinstance(t, ObservationNorm)]
    assert torch.equal(norm.loc, namespace["checkpoint"].obs_norm["loc"])
    assert capsys.readouterr().out.splitlines()[-1].endswith("[200, 200]")


def test_the_export_section_s_examples_run(tmp_path, monkeypatch):
    """Every command of the section runs (in-process, from an empty directory: ``python -m module args`` is the
    module's ``main(args)``) and exits 0, then every Python block runs."""
    pytest.importorskip("onnxruntime")
    monkeypatch.chdir(tmp_path)
    blocks = doc_blocks(USAGE, "Export a policy")
    assert [lang for lang, _ in blocks] == ["bash", "python", "python"]
    for lang, code in blocks:
        if lang == "python":
            exec(compile(code, "docs/usage.md", "exec"), {})
            continue
        for line in code.splitlines():
            python, dash_m, module, *args = shlex.split(line, comments=True)
            assert (python, dash_m) == ("python", "-m"), line
            assert importlib.import_module(module).main(args) == 0, line
    assert (tmp_path / "runs" / "sac-pendulum" / "export" / "policy.onnx.json").is_file()


def test_the_loop_quoted_in_the_docs_is_the_one_in_loop_py():
    """docs/offpolicy.md quotes ``train_loop`` whole: the quote is the function as the file has it, to its last line."""
    [(language, code)] = doc_blocks(REPO / "docs" / "offpolicy.md", "The loop")
    source = (REPO / "offpolicy" / "loop.py").read_text()
    assert language == "python" and code.startswith("def train_loop(run)")
    assert code in source, "docs/offpolicy.md's loop differs from offpolicy/loop.py's train_loop"
    after = [line for line in source[source.index(code) + len(code):].splitlines() if line.strip()]
    assert not after or not after[0][0].isspace(), "docs/offpolicy.md quotes only part of train_loop"


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``: lower case, punctuation but ``-`` and ``_`` dropped, spaces
    as ``-``, a repeated anchor numbered ``-1``, ``-2``, ..."""
    anchors, fence = set(), False
    for line in page.read_text().splitlines():
        fence ^= line.startswith("```")
        if not fence and (heading := re.match(r"#+ (.*)", line)):
            anchor = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            numbered, n = anchor, 0
            while numbered in anchors:
                n += 1
                numbered = f"{anchor}-{n}"
            anchors.add(numbered)
    return anchors


def broken_links(page: Path) -> list[str]:
    """The relative links and images of ``page`` (outside code) whose file does not exist, or whose ``#anchor`` is no
    heading of the Markdown file it points to."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    broken = []
    for target in re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):  # https:, mailto:: not a file of this repository
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(f"{target}: no heading #{anchor} in {file.name}")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_image_resolves(page):
    assert not broken_links(page)


def test_the_link_check_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## A section\n")
    page = tmp_path / "page.md"
    page.write_text("# Page\n\n[ok](other.md#a-section) [self](#page) ![gone](img/gone.png) [no](other.md#nowhere)\n"
                    "[web](https://example.org) `[code](skipped.md)`\n```\n[fenced](skipped.md)\n```\n")
    assert [line.split(":")[0] for line in broken_links(page)] == ["img/gone.png", "other.md#nowhere"]
