"""The one declaration of every config key: its default, what it allows and its one-line doc, as a field of a
dataclass (one dataclass per config section, omegaconf's structured-config idiom). Everything else is derived from
it: the defaults a run composes from, the per-key checks, the commented YAML reference (``configs/<engine>/*.yaml``,
what ``--help`` prints) and the tables of docs/config.md. A test fails when a generated file is stale; rewrite them
with ``python -m a3c.config`` and ``python -m offpolicy.config``.

A section's checks across keys are its ``check(cfg)`` staticmethod, declared beside the keys they constrain, run in
declaration order after every key has passed its own rule.
"""
from __future__ import annotations

import copy
import dataclasses
import re
import textwrap
from pathlib import Path
from typing import Any, Callable, Iterator

import yaml

from shared.config import Rule

YAML_WIDTH = 120  # the width the generated YAML wraps its comments at
VALUE_COLUMN = 28  # where the generated YAML's comments start


def key(default: Any, doc: str, **allowed) -> Any:
    """A config key: its ``default``, its ``doc`` (Markdown: backticks and links, plain in the YAML) and what it
    allows (:class:`~shared.config.Rule`'s keywords: ``min``, ``max``, ``choices``, ``integer``, ``nullable``,
    ``number``, ``auto``, ``check``). No keywords: any value of the default's type."""
    metadata = {"doc": doc, "rule": Rule(**allowed) if allowed else None}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: copy.deepcopy(default), metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def section(cls: type, doc: str = "") -> Any:
    """A nested section (a dataclass of keys) with an optional doc, printed beside its name."""
    return dataclasses.field(default_factory=cls, metadata={"doc": doc, "section": True})


@dataclasses.dataclass(frozen=True)
class Entry:
    """One declared key or section, as the generators and the checks read it."""

    key: str  # dotted, e.g. "optim.lr"
    default: Any
    doc: str
    rule: Rule | None
    is_section: bool
    depth: int


def entries(schema: type, prefix: str = "", depth: int = 0) -> Iterator[Entry]:
    """Every key and section of ``schema`` in declaration order, sections before their keys."""
    instance = schema()
    for field in dataclasses.fields(schema):
        full = f"{prefix}{field.name}"
        if field.metadata.get("section"):
            yield Entry(full, None, field.metadata.get("doc", ""), None, True, depth)
            yield from entries(field.default_factory, full + ".", depth + 1)
        else:
            yield Entry(full, getattr(instance, field.name), field.metadata.get("doc", ""),
                        field.metadata.get("rule"), False, depth)


def defaults(schema: type) -> dict:
    """The defaults as a nested dict (what a run composes from)."""
    return dataclasses.asdict(schema())


def rules(schema: type, prefix: str = "") -> dict[str, Rule]:
    """Each key's rule, by dotted key (keys without one take any value of their default's type)."""
    return {e.key: e.rule for e in entries(schema, prefix) if e.rule is not None}


def checks(schema: type) -> list[Callable]:
    """The sections' checks across keys (``check(cfg)``), outermost last, in declaration order."""
    found = []
    for field in dataclasses.fields(schema):
        if field.metadata.get("section"):
            found += checks(field.default_factory)
    own = schema.__dict__.get("check")
    return found + ([own.__func__ if isinstance(own, staticmethod) else own] if own is not None else [])


def plain(doc: str) -> str:
    """A doc's Markdown as plain text: links to their text, no backticks."""
    return re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", doc).replace("`", "")


def yaml_value(value: Any) -> str:
    """A value as YAML writes it on one line (``null``, ``0.0003``, ``[256, 256]``)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def to_yaml(schema: type, header: str) -> str:
    """The commented YAML reference of ``schema``: ``header`` (comment lines), then every key with its default and
    its doc, wrapped at :data:`YAML_WIDTH`."""
    lines = [f"# {part}" for line in header.strip().splitlines() for part in textwrap.wrap(line, YAML_WIDTH - 2)
             or [""]] + [""]
    previous_depth = 0
    for entry in entries(schema):
        indent = "  " * entry.depth
        name = entry.key.rsplit(".", 1)[-1]
        if entry.is_section and entry.depth == 0 and lines[-1] != "":
            lines.append("")
        if not entry.is_section and entry.depth == 0 and previous_depth > 0:
            lines.append("")
        left = f"{indent}{name}:" if entry.is_section else f"{indent}{name}: {yaml_value(entry.default)}"
        previous_depth = entry.depth
        doc = plain(entry.doc)
        if not doc:
            lines.append(left)
            continue
        column = max(VALUE_COLUMN, len(left) + 1)
        wrapped = textwrap.wrap(doc, YAML_WIDTH - VALUE_COLUMN - 2) or [""]
        first, rest = wrapped[0], wrapped[1:]
        if len(left) + 1 > VALUE_COLUMN:  # a long key: its first comment line is shorter
            wrapped = textwrap.wrap(doc, YAML_WIDTH - column - 2)
            first, rest = wrapped[0], textwrap.wrap(" ".join(wrapped[1:]), YAML_WIDTH - VALUE_COLUMN - 2)
        lines.append(f"{left.ljust(column)}# {first}")
        lines += [" " * VALUE_COLUMN + f"# {line}" for line in rest]
    return "\n".join(lines).rstrip() + "\n"


def markdown_value(value: Any) -> str:
    return f"`{yaml_value(value)}`"


def to_markdown(schema: type, variants: dict[str, dict] | None = None, prefix: str = "") -> str:
    """The Markdown table of ``schema``'s keys (named ``prefix`` + key): key, default (and where ``variants`` (name ->
    composed config as a dict) differ from it, their values), allowed values, meaning."""
    rows = ["| key | default | allowed | meaning |", "|---|---|---|---|"]
    for entry in entries(schema, prefix):
        if entry.is_section:
            continue
        default = markdown_value(entry.default)
        differ = []
        for name, config in (variants or {}).items():
            value = _select(config, entry.key)
            if value != entry.default:
                differ.append(f"{name} {markdown_value(value)}")
        if differ:
            default += " (" + ", ".join(differ) + ")"
        allowed = entry.rule.describe() if entry.rule is not None else _type_name(entry.default)
        rows.append(f"| `{entry.key}` | {default} | {allowed} | {entry.doc.replace('|', '&#124;')} |")
    return "\n".join(rows) + "\n"


def _type_name(default: Any) -> str:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a number"
    if isinstance(default, list):
        return "a list"
    return "a string or null" if default is None else "a string"


def _select(config: dict, dotted: str) -> Any:
    for part in dotted.split("."):
        config = config[part]
    return config


def replace_block(text: str, name: str, body: str) -> str:
    """``text`` with the generated block ``name`` (between ``<!-- generated: name -->`` and ``<!-- end: name -->``)
    replaced by ``body``; a ValueError when the markers are missing."""
    start, end = f"<!-- generated: {name} -->", f"<!-- end: {name} -->"
    if start not in text or end not in text:
        raise ValueError(f"docs/config.md has no block {name!r} ({start} ... {end})")
    before, rest = text.split(start, 1)
    _, after = rest.split(end, 1)
    return f"{before}{start}\n{body}{end}{after}"


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds it; whether it was written."""
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
