"""The README's config reference names every key of every config file, so it cannot silently fall behind; the
README's "Export a policy" examples run as written."""
import importlib
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
    """The fenced code blocks ``(language, code)`` of the README section headed ``section`` (up to the next heading of
    the same or a higher level)."""
    readme = (REPO / "README.md").read_text()
    start = re.search(rf"^(#+) {re.escape(section)}$", readme, re.M)
    assert start, f"README.md has no section {section!r}"
    end = re.compile(rf"^#{{1,{len(start.group(1))}}} ", re.M).search(readme, start.end())
    text = readme[start.end():end.start() if end else None]
    return re.findall(r"^```(\w+)\n(.*?)^```$", text, re.M | re.S)


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
