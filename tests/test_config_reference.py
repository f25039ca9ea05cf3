"""One declaration per key (shared/schema.py): the files generated from the declarations are current, every key a
config file sets is declared, and a declaration's rule is what the composed config enforces."""
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import a3c.config as a3c_config
import offpolicy.config as offpolicy_config
from offpolicy.algos import ALGORITHMS
from shared import schema
from shared.config import ConfigError

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("module", [a3c_config, offpolicy_config], ids=["a3c", "offpolicy"])
def test_the_generated_reference_is_current(module, tmp_path, monkeypatch):
    """``python -m <engine>.config`` would write nothing: configs/<engine>/*.yaml and docs/config.md hold what the
    declarations generate."""
    written = {}
    monkeypatch.setattr(schema, "write_if_changed",
                        lambda path, text: written.setdefault(str(path), Path(path).read_text() != text))
    module.write_reference()
    stale = [path for path, changed in written.items() if changed]
    assert written and not stale, f"stale: {stale}; run python -m {module.__name__}"


def test_the_generator_rewrites_a_stale_file(tmp_path, monkeypatch):
    """The check above can fail: an edited reference is found stale and rewritten."""
    target = tmp_path / "config.yaml"
    target.write_text("algo: dqn\n")
    assert schema.write_if_changed(target, offpolicy_config.reference())
    assert target.read_text() == offpolicy_config.reference()
    assert not schema.write_if_changed(target, offpolicy_config.reference())


def test_the_yaml_reference_reads_back_as_the_declared_defaults():
    assert OmegaConf.to_container(OmegaConf.load(REPO / "configs/offpolicy/config.yaml")) == \
        schema.defaults(offpolicy_config.OffPolicyConfig)
    assert OmegaConf.to_container(OmegaConf.load(REPO / "configs/a3c/config.yaml")) == \
        schema.defaults(a3c_config.A3CConfig)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_declares_its_section_and_its_file_only_changes_declared_keys(name):
    cfg, _ = offpolicy_config.compose_config([f"algo={name}", "profile=smoke"])
    assert set(cfg[name]) == set(schema.defaults(ALGORITHMS[name].config))
    others = set(ALGORITHMS) - {name}
    assert not others & set(cfg), "only the chosen algorithm's section is in a run's config"
    layer = OmegaConf.to_container(OmegaConf.load(REPO / f"configs/offpolicy/algo/{name}.yaml"))
    assert name not in layer, "the section's defaults are declared in the module, not in the yaml"


def test_every_key_has_a_doc_and_a_default_of_its_declared_kind():
    for config in [offpolicy_config.OffPolicyConfig, a3c_config.A3CConfig,
                   *(a.config for a in ALGORITHMS.values())]:
        for entry in schema.entries(config):
            assert entry.doc or entry.is_section, f"{config.__name__}.{entry.key} has no doc"
            if entry.rule is not None and not entry.is_section:
                entry.rule.validate(entry.key, entry.default)  # every default passes its own rule


def test_a_declared_rule_is_enforced_with_one_line():
    with pytest.raises(ConfigError, match=r"^dqn\.eps_end=2\.0 is out of range; allowed: a number >= 0 <= 1$"):
        offpolicy_config.compose_config(["algo=dqn", "dqn.eps_end=2.0"])
    with pytest.raises(ConfigError, match=r"^unknown key 'sac\.alpha_init'"):
        offpolicy_config.compose_config(["algo=dqn", "sac.alpha_init=0.5"])


def test_help_prints_the_generated_reference():
    out = subprocess.run([sys.executable, "-m", "offpolicy.train", "--help"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 0 and offpolicy_config.reference() in out.stdout


def _leaves(tree: dict, prefix: str = "") -> set[str]:
    keys = set()
    for name, value in tree.items():
        keys |= _leaves(value, f"{prefix}{name}.") if isinstance(value, dict) else {prefix + name}
    return keys


@pytest.mark.parametrize("engine", ["a3c", "offpolicy"])
def test_every_group_file_sets_only_declared_keys(engine):
    """Profiles and algorithm files change declared keys only (``extends`` names another file of the group)."""
    declared = _leaves(schema.defaults(a3c_config.A3CConfig) if engine == "a3c" else
                       {**schema.defaults(offpolicy_config.OffPolicyConfig),
                        **{name: schema.defaults(a.config) for name, a in ALGORITHMS.items()}})
    groups = (a3c_config if engine == "a3c" else offpolicy_config).GROUPS  # search spaces (tune/) are no group
    files = sorted(path for group in groups for path in (REPO / "configs" / engine / group.name).glob("*.yaml"))
    assert files
    for path in files:
        unknown = _leaves(OmegaConf.to_container(OmegaConf.load(path))) - declared - {"extends"}
        assert not unknown, f"{path.relative_to(REPO)} sets undeclared keys {sorted(unknown)}"
