"""The README's config reference names every key of every config file, so it cannot silently fall behind."""
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


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.name in ("config.yaml", "evaluate.yaml")],
                         ids=lambda p: str(p.relative_to(REPO)))
def test_readme_documents_every_key(path):
    readme = (REPO / "README.md").read_text()
    missing = [k for k in _leaf_keys(OmegaConf.load(path)) if f"`{k}`" not in readme]
    assert not missing, f"README.md does not document {missing}"


def test_readme_test_command_is_the_one_ci_runs():
    ci = (REPO / ".ci" / "run").read_text().strip().splitlines()[-1]
    assert ci == "python -m pytest -q" and ci in (REPO / "README.md").read_text()
