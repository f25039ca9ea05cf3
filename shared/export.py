"""Policy export for both engines (``python -m offpolicy.export``, ``python -m a3c.export``): a module from tensors to
actions, written as one TorchScript or ONNX file, and a JSON spec of its inputs and outputs beside it.

TorchScript is written by ``torch.jit.trace`` and loads with ``torch.jit.load`` in any torch process (Python or C++)
without this project; torch 2.13 marks torch.jit deprecated in favour of torch.export, whose files need torch as well.
ONNX is written by ``torch.onnx.export`` (its exporter on torch.export, which needs onnx and onnxscript: the ``onnx``
extra) and runs in onnxruntime. Both keep the batch dimension free.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from shared.config import ConfigError, ensure_writable_dir
from shared.schema import key

FORMATS = {"torchscript": ".pt", "onnx": ".onnx"}  # format -> the default file's suffix
LOAD = {  # how the spec tells a user to run the file
    "torchscript": "torch.jit.load(file)(*inputs) -> outputs (torch tensors)",
    "onnx": "onnxruntime.InferenceSession(file).run(None, {name: array, ...}) -> [outputs] (numpy arrays)",
}
EXAMPLE_BATCH = 2  # the traced example's batch (torch.export would fix a batch of 1 as a constant)


@dataclass
class ExportConfig:
    """The keys of both engines' ``export`` CLIs."""

    checkpoint: str | None = key(None, "path to a checkpoint written by the engine's train (required)")
    format: str = key("torchscript", "torchscript (torch.jit.load) | onnx (onnxruntime; needs the onnx extra)",
                      choices=tuple(FORMATS))
    out: str | None = key(None, "the exported file; its spec goes beside it as <file>.json (default: the checkpoint's "
                                "run dir, export/policy.pt or export/policy.onnx)")


def export_header(engine: str) -> str:
    """The first lines of ``configs/<engine>/export.yaml`` (and of ``python -m <engine>.export --help``)."""
    return (f"python -m {engine}.export checkpoint=<path> [format=torchscript|onnx] [out=PATH]: the deterministic "
            "evaluation policy of a saved run as one file that runs without this project, with its input/output "
            f"spec as JSON.\nGenerated from shared/export.py by `python -m {engine}.config`: edit the declarations "
            "there, not this file.")


@dataclass
class Port:
    """One input or output of an exported policy: its name, shape after the batch dimension, dtype and meaning
    (``extra``: more JSON fields, such as an action's bounds). An output's shape and dtype are read off the module's
    answer to the example input."""

    name: str
    description: str
    shape: tuple[int, ...] = ()
    dtype: torch.dtype = torch.float32
    extra: dict = field(default_factory=dict)

    def example(self) -> torch.Tensor:
        return torch.zeros(EXAMPLE_BATCH, *self.shape, dtype=self.dtype)

    def as_json(self) -> dict:
        return {"name": self.name, "shape": ["batch", *self.shape], "dtype": str(self.dtype).removeprefix("torch."),
                "description": self.description, **self.extra}


def output_paths(args) -> tuple[Path, Path]:
    """The exported file (``args.out``, default ``<run dir>/export/policy.pt`` or ``.onnx``, the run dir being the
    checkpoint's, ``<run>/checkpoints/last.pt``) and its spec beside it (``<file name>.json``, so the two formats'
    specs do not collide); the directory is created (a ConfigError naming ``out`` if it cannot be)."""
    run_dir = Path(args.checkpoint).resolve().parent.parent
    path = Path(args.out) if args.out else run_dir / "export" / f"policy{FORMATS[args.format]}"
    ensure_writable_dir(path.parent, "out")
    return path, path.with_name(f"{path.name}.json")


def check_format_installed(fmt: str) -> None:
    """A ConfigError naming ``format`` when the format's packages are missing (ONNX: onnx and onnxscript)."""
    if fmt != "onnx":
        return
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"format=onnx needs the onnx extra ({exc.name} is not installed: pip install -e '.[onnx]'); "
                          "allowed: format=torchscript, or install the extra") from None


def export_policy(module: nn.Module, inputs: list[Port], outputs: list[Port], fmt: str, path: Path, spec_path: Path,
                  about: dict) -> dict:
    """Write ``module`` (``inputs`` in, ``outputs`` out, batch first) to ``path`` in format ``fmt`` and its spec to
    ``spec_path``: ``about`` (where the policy comes from), the format, how to load it, and each port. Returns the
    spec."""
    module = module.eval().requires_grad_(False)  # an inference file: its outputs need no .detach()
    example = tuple(port.example() for port in inputs)
    with torch.no_grad():
        answers = module(*example)
        answers = answers if isinstance(answers, tuple) else (answers,)
        for port, answer in zip(outputs, answers, strict=True):
            port.shape, port.dtype = tuple(answer.shape[1:]), answer.dtype
        if fmt == "torchscript":
            with warnings.catch_warnings():
                # torch 2.13 deprecates torch.jit (TorchScript files still load); torchrl's distribution checks its
                # constant action bounds with Python booleans (TracerWarning). The tests hold the file's actions to
                # the live policy's.
                warnings.simplefilter("ignore", DeprecationWarning)
                warnings.simplefilter("ignore", torch.jit.TracerWarning)
                torch.jit.trace(module, example).save(str(path))
        else:
            batch = torch.export.Dim("batch")
            torch.onnx.export(module, example, str(path), dynamo=True, external_data=False, verbose=False,
                              input_names=[p.name for p in inputs], output_names=[p.name for p in outputs],
                              dynamic_shapes=tuple({0: batch} for _ in inputs))
    spec = {**about, "format": fmt, "file": path.name, "load": LOAD[fmt],
            "inputs": [p.as_json() for p in inputs], "outputs": [p.as_json() for p in outputs]}
    spec_path.write_text(json.dumps(spec, indent=2))
    print(f"exported {about.get('policy', 'the policy')} as {fmt}: {path} (spec: {spec_path})")
    return spec
