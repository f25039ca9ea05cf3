"""Strict configuration: declared defaults + group files + CLI ``key=value`` overrides (omegaconf).

Every entry point composes its config the same way:

1. every key is declared once with its default, rule and doc (shared/schema.py; the engine's config module), from
   which ``configs/<engine>/config.yaml`` (the commented reference ``--help`` prints) and docs/config.md are generated;
2. group files (``configs/<engine>/<group>/<name>.yaml``, e.g. ``algo=sac`` or ``profile=smoke``) are merged on top;
3. ``key=value`` overrides from the command line are applied last; short aliases (``env=Pong``) expand to full keys.

Anything wrong raises :class:`ConfigError` with one line naming the key and what is allowed; :func:`run_cli` turns it
into ``error: ...`` on stderr and exit code 2, without a traceback.
"""
from __future__ import annotations

import atexit
import datetime
import gc
import json
import math
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """A bad input: the message is one line naming the key and what is allowed."""


@dataclass(frozen=True)
class Rule:
    """Allowed values of one config key (checked after the whole config is composed)."""

    min: float | None = None
    max: float | None = None
    choices: tuple | None = None
    integer: bool = False
    check: Callable[[Any], None] | None = None  # raises ConfigError itself
    nullable: bool = False
    number: bool = False  # any finite number (for keys without a range)
    auto: bool = False  # the string "auto" is allowed too (a default of "auto" does not make a number a string)

    def describe(self) -> str:
        parts = ["auto or"] if self.auto else []
        if self.choices is not None:
            parts.append("one of " + ", ".join("null" if c is None else str(c).lower() if isinstance(c, bool) else str(c)
                                                for c in self.choices))
        else:
            parts.append("an integer" if self.integer else "a number")
            if self.min is not None:
                parts.append(f">= {self.min}")
            if self.max is not None:
                parts.append(f"<= {self.max}")
        if self.nullable:
            parts.append("or null")
        return " ".join(parts)

    def allows(self, value: Any) -> bool:
        """``value`` keeps its own type: one of ``choices``, of the same type (``1`` is not ``true``); with ``auto``
        any value (:meth:`validate` then allows "auto" or a number in range)."""
        if self.auto:
            return True
        return self.choices is not None and any(type(value) is type(c) and value == c for c in self.choices)

    def validate(self, key: str, value: Any) -> None:
        if (value is None and self.nullable) or (self.auto and value == "auto"):
            return
        if self.choices is not None:
            if not self.allows(value):
                raise ConfigError(f"{key}={value!r} is not allowed; allowed: {self.describe()}")
        elif self.min is not None or self.max is not None or self.integer or self.number:
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            if (
                not numeric
                or not math.isfinite(value)
                or (self.integer and not float(value).is_integer())
                or (self.min is not None and value < self.min)
                or (self.max is not None and value > self.max)
            ):
                raise ConfigError(f"{key}={value!r} is out of range; allowed: {self.describe()}")
        if self.check is not None:
            self.check(value)


@dataclass(frozen=True)
class Group:
    """A config group: ``<name>=<file>`` merges ``<config_dir>/<name>/<file>.yaml``, or the YAML file at a path ending
    in ``.yaml`` / ``.yml`` (after the file named by its ``extends:`` key, if it has one); it may only change declared
    keys."""

    name: str


def parse_overrides(argv: Iterable[str], aliases: dict[str, str] | None = None) -> dict[str, str]:
    """Turn ``["env=Pong", "a.b=3"]`` into ``{"env.name": "Pong", "a.b": "3"}`` (values still raw strings)."""
    aliases = aliases or {}
    overrides: dict[str, str] = {}
    for arg in argv:
        key, sep, value = arg.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"argument {arg!r} is not of the form key=value (run with --help for the keys)")
        overrides[aliases.get(key, key)] = value
    return overrides


def overrides_argv(overrides: Mapping[str, Any]) -> list[str]:
    """Python keyword overrides as the command line's ``key=value`` words, so that they are parsed and checked exactly
    as the CLI's: a dict sets the keys under its key (``optim={"lr": 1e-3}`` is ``optim.lr=0.001``); a string is
    written as it is when the CLI reads it back as the same string, else quoted (``"true"`` stays a string); a path
    is its string; other values are written as JSON, which the YAML parser reads back (``[64, 64]``, ``null``,
    ``false``). A value of another type is a ConfigError."""
    words = []
    for key, value in overrides.items():
        if isinstance(value, Mapping):
            words += overrides_argv({f"{key}.{k}": v for k, v in value.items()})
            continue
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str) and _reads_back(key, value):
            words.append(f"{key}={value}")
            continue
        try:
            words.append(f"{key}={json.dumps(value)}")
        except TypeError:
            raise ConfigError(f"{key}={value!r} has the wrong type; allowed: a number, string, bool, None, list, "
                              "dict or path") from None
    return words


def _reads_back(key: str, word: str) -> bool:
    try:
        return _parse_value(key, word) == word
    except ConfigError:
        return False


def _parse_value(key: str, raw: str) -> Any:
    try:
        return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={raw}"]))["v"]
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{key}={raw!r} cannot be parsed: {str(exc).splitlines()[0]}") from None


def _coerce(key: str, old: Any, new: Any) -> Any:
    """Keep the default's type: an int key takes integral numbers, a float key takes any number, etc."""
    if old is None or new is None:
        return new
    if isinstance(old, bool):
        if isinstance(new, bool):
            return new
        raise ConfigError(f"{key}={new!r} has the wrong type; allowed: true or false")
    if isinstance(old, int):
        if isinstance(new, (int, float)) and not isinstance(new, bool) and float(new).is_integer():
            return int(new)
        raise ConfigError(f"{key}={new!r} has the wrong type; allowed: an integer")
    if isinstance(old, float):
        if isinstance(new, (int, float)) and not isinstance(new, bool):
            return float(new)
        raise ConfigError(f"{key}={new!r} has the wrong type; allowed: a number")
    if isinstance(old, str):
        if isinstance(new, (str, int, float)) and not isinstance(new, bool):
            return str(new)
        raise ConfigError(f"{key}={new!r} has the wrong type; allowed: a string")
    if isinstance(old, (list, dict)):
        if isinstance(new, type(old)):
            return new
        raise ConfigError(f"{key}={new!r} has the wrong type; allowed: a {type(old).__name__}")
    return new


def _group_choices(config_dir: Path, group: str) -> list[str]:
    return sorted(p.stem for p in (config_dir / group).glob("*.yaml"))


def _merge_group(cfg: DictConfig, config_dir: Path, group: Group, choice: str) -> DictConfig:
    # a path lets a file written elsewhere (offpolicy.tools.tune's best profile) be used where it lies
    path = Path(choice) if choice.endswith((".yaml", ".yml")) else config_dir / group.name / f"{choice}.yaml"
    if not path.is_file():
        allowed = ", ".join(_group_choices(config_dir, group.name))
        raise ConfigError(f"{group.name}={choice!r} does not exist; allowed: {allowed} or the path of a YAML file")
    layer = OmegaConf.load(path)  # omegaconf reads YAML with yaml.SafeLoader
    parent = layer.pop("extends", None)  # a group file may start from another file of its group
    if parent is not None:
        cfg = _merge_group(cfg, config_dir, group, str(parent))
    OmegaConf.set_struct(cfg, True)
    try:
        merged = OmegaConf.merge(cfg, layer)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None) or "?"
        raise ConfigError(f"{path.name} sets unknown key '{key}' for group {group.name}") from None
    OmegaConf.set_struct(merged, False)
    return merged


def compose(
    defaults: dict,
    overrides: dict[str, str],
    *,
    config_dir: Path | None = None,
    groups: Sequence[Group] = (),
    rules: dict[str, Rule] | None = None,
    base: dict | None = None,
) -> DictConfig:
    """Compose the declared ``defaults`` (shared/schema.py), group files (``config_dir/<group>/<choice>.yaml``), an
    optional ``base`` (a resumed run's config) and CLI overrides; check every key against its rule."""
    cfg = OmegaConf.create(defaults)
    overrides = dict(overrides)
    for group in groups:
        choice = overrides.pop(group.name, None)
        if choice is None and base is not None:
            choice = base.get(group.name)
        choice = choice if choice is not None else cfg.get(group.name)
        if choice is not None:
            cfg = _merge_group(cfg, config_dir, group, str(choice))
            cfg[group.name] = str(choice)
    if base is not None:
        cfg = OmegaConf.merge(cfg, {k: v for k, v in base.items() if k not in {g.name for g in groups}})
    OmegaConf.set_struct(cfg, True)
    for key, raw in overrides.items():
        try:
            old = OmegaConf.select(cfg, key, throw_on_missing=False, default=_MISSING)
        except OmegaConfBaseException:
            old = _MISSING
        if old is _MISSING:
            raise ConfigError(f"unknown key '{key}'; {_suggest(cfg, key)}")
        if isinstance(old, DictConfig):
            raise ConfigError(f"'{key}' is a section; set one of its keys: {', '.join(f'{key}.{k}' for k in old)}")
        value = _parse_value(key, raw)
        rule = (rules or {}).get(key)
        if not (rule is not None and rule.allows(value)):  # a listed choice may differ in type from the default
            value = _coerce(key, OmegaConf.to_container(old) if OmegaConf.is_config(old) else old, value)
        OmegaConf.update(cfg, key, value, merge=False)
    for key, rule in (rules or {}).items():
        rule.validate(key, OmegaConf.select(cfg, key))
    return cfg


_MISSING = object()


def _flat_keys(cfg: DictConfig, prefix: str = "") -> list[str]:
    keys = []
    for k, v in cfg.items():
        full = f"{prefix}{k}"
        keys.extend(_flat_keys(v, full + ".") if isinstance(v, DictConfig) else [full])
    return keys


def _suggest(cfg: DictConfig, key: str) -> str:
    import difflib

    keys = _flat_keys(cfg)
    close = difflib.get_close_matches(key, keys, n=3, cutoff=0.5)
    if not close:
        leaf = key.rsplit(".", 1)[-1]
        close = [k for k in keys if k.rsplit(".", 1)[-1] == leaf][:3]
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    return hint + "run with --help for every key"


def help_text(reference: str, usage: str, aliases: dict[str, str], groups: Sequence[Group] = (),
              config_dir: Path | None = None) -> str:
    """The config reference: usage, aliases, group choices (files in ``config_dir``) and the commented defaults
    ``reference`` (generated from the declarations, shared/schema.py)."""
    lines = [usage, ""]
    if aliases:
        lines.append("aliases: " + ", ".join(f"{a}= -> {k}=" for a, k in aliases.items()))
    for group in groups:
        lines.append(f"{group.name}=: " + " | ".join(_group_choices(config_dir, group.name)))
    lines += ["", reference]
    return "\n".join(lines)


def make_run_dir(cfg: DictConfig, name: str) -> Path:
    """Create the run dir (``cfg.run_dir`` or ``runs/<name>-<time>``, one directory whatever ``name`` holds: an env id's
    ``/`` and ``:`` become ``-``), store it in cfg and save the resolved config."""
    if cfg.get("run_dir"):
        run_dir = Path(cfg.run_dir)
    else:
        stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
        run_dir = Path("runs") / re.sub(r"[/\\:\s]+", "-", f"{name}-{stamp}")
    ensure_writable_dir(run_dir, "run_dir")
    cfg.run_dir = str(run_dir)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    return run_dir


def ensure_writable_dir(path: str | Path, key: str) -> Path:
    """Create ``path`` (and its parents) and check that files can be written in it; a failure is one ConfigError
    naming ``key``."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".write-check"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"{key}={str(path)!r} cannot be created or written ({exc.strerror or exc}); allowed: a "
                          "directory this user can create and write") from None
    return path


def run_cli(main: Callable[[list[str]], int | None], argv: list[str] | None = None) -> None:
    """Run an entry point: a ConfigError becomes one ``error:`` line and exit code 2; output piped into a reader that
    stops early (``| head``) ends the run quietly, as other command-line tools do."""
    # at exit, the interpreter's last garbage collections skip the frozen objects: walking the millions that torch,
    # torchrl and Ray allocate took 1-4 s of every run's exit on a 2-core machine, to free memory the process's end
    # frees anyway (registered first, it runs after every other exit handler: Ray's shutdown, the loggers')
    atexit.register(gc.freeze)
    try:
        code = main(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit's own flush does not fail again
        sys.exit(141)  # 128 + SIGPIPE, what a shell reports for a reader that left
    sys.exit(code or 0)


def check_kept_on_resume(cfg: DictConfig, saved: DictConfig, keys, why: str) -> None:
    """A resume keeps each of ``keys`` as the checkpoint's config ``saved`` has it; a ConfigError naming the key and
    the saved value otherwise (``why``: what was built with it)."""
    for key in keys:
        if OmegaConf.select(cfg, key) != OmegaConf.select(saved, key):
            raise ConfigError(f"{key}={OmegaConf.select(cfg, key)} differs from the resumed run's; allowed: "
                              f"{OmegaConf.select(saved, key)} ({why})")
