"""``python -m a3c.export checkpoint=<path> format=torchscript|onnx [out=PATH]``: the greedy policy of an ``a3c.train``
checkpoint (the argmax of the actor-critic's logits, as ``a3c.evaluate`` plays) as one file that runs without this
project, with the JSON spec of its inputs and outputs beside it (shared/export.py).

Input: the stacked uint8 frames the Atari stack gives (scaled by 1/255 inside). The recurrent model
(``model.recurrent=lstm``) has no stateless form: its file maps ``(observation, h, c)`` to ``(action, h, c)``, the
caller carrying the LSTM state from step to step and zeroing it where the evaluation does.
"""
from __future__ import annotations

import torch
from torch import nn

from a3c.model import checkpoint_model, read_checkpoint
from shared.atari import AtariSettings
from shared.config import run_cli
from shared.evaluation import evaluate_cli_args
from shared.export import ExportConfig, Port, check_format_installed, export_header, export_policy, output_paths
from shared.models import AtariActorCritic

USAGE = "usage: python -m a3c.export checkpoint=<path> [format=torchscript|onnx] [out=PATH]"


class GreedyAction(nn.Module):
    """The feed-forward model's greedy policy: frames ``[B, C, H, W]`` -> action indices ``[B]`` (int64)."""

    def __init__(self, model: AtariActorCritic):
        super().__init__()
        self.model = model

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        logits, _, _ = self.model.step(observation, None)
        return logits.argmax(-1)


class RecurrentGreedyAction(nn.Module):
    """The recurrent model's greedy policy: ``(frames, h, c)`` -> ``(action indices, next h, next c)``."""

    def __init__(self, model: AtariActorCritic):
        super().__init__()
        self.model = model

    def forward(self, observation: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        logits, _, (h, c) = self.model.step(observation, (h, c))
        return logits.argmax(-1), h, c


def ports(cfg, model: AtariActorCritic) -> tuple[list[Port], list[Port]]:
    """The exported policy's inputs and outputs, described for the run's game and model."""
    settings = AtariSettings.from_config(cfg.env)
    frames = Port("observation", settings.describe_frames(), (settings.channels, settings.image_size,
                                                              settings.image_size), torch.uint8)
    action = Port("action", f"int64: the index of the greedy action (argmax of the policy logits) in {cfg.env.name}'s "
                  f"minimal action set ({model.policy_head.out_features} actions)",
                  extra={"n": model.policy_head.out_features})
    if not model.recurrent:
        return [frames], [action]
    resets = "a new game and every lost life" if cfg.env.episodic_life else "a new game"
    state = [Port(name, f"float32: the LSTM's {what}; zeros at {resets} (as the "
                  f"evaluation resets it), else the previous step's next_{name}", (model.lstm.hidden_size,))
             for name, what in (("h", "hidden state"), ("c", "cell state"))]
    next_state = [Port(f"next_{name}", f"float32: the LSTM's {name} after this step", (model.lstm.hidden_size,))
                  for name in ("h", "c")]
    return [frames, *state], [action, *next_state]


def main(argv: list[str]) -> int:
    """Export a checkpoint's greedy policy; prints where the file and its spec went."""
    args = evaluate_cli_args(ExportConfig, export_header("a3c"), USAGE, argv, written_by="a3c.train")
    if args is None:
        return 0
    check_format_installed(args.format)
    ckpt = read_checkpoint(args.checkpoint)
    path, spec_path = output_paths(args)
    cfg, model = checkpoint_model(ckpt)
    inputs, outputs = ports(cfg, model)
    policy = RecurrentGreedyAction(model) if model.recurrent else GreedyAction(model)
    about = {"policy": f"A3C on {cfg.env.name}", "produced_by": "a3c.export", "env": cfg.env.name,
             "model": {"arch": cfg.model.arch, "recurrent": cfg.model.recurrent}, "checkpoint": str(args.checkpoint),
             "frames_trained": ckpt["counters"]["frames"]}
    export_policy(policy, inputs, outputs, args.format, path, spec_path, about)
    return 0


if __name__ == "__main__":
    run_cli(main)
