"""``python -m offpolicy.export checkpoint=<path> format=torchscript|onnx [out=PATH]``: the deterministic evaluation
policy of an ``offpolicy.train`` checkpoint as one file that runs without this project (TorchScript: torch alone;
ONNX: onnxruntime), with the JSON spec of its input and output beside it (shared/export.py).

The file maps the env's own observations to actions: the cast to float32 and, with ``env.obs_norm``, the run's
standardisation are inside, and so is the action range (continuous actions come out within the env's bounds; DQN's
as the index of the greedy action). It plays what ``offpolicy.evaluate`` plays, in float32: a DQN whose CNN trained
in bfloat16 (its conv precision) is written to compute in float32, which every TorchScript and ONNX runtime runs
(its weights are float32 already), so a near-tie between two Q values may resolve the other way. The policy on
plain tensors is the form the run's algorithm declares (``AlgoParts.eval_tensor_policy``, offpolicy/algos/).
"""
from __future__ import annotations

import torch
from omegaconf import OmegaConf
from torch import nn

from shared.config import run_cli
from shared.evaluation import evaluate_cli_args
from shared.export import ExportConfig, Port, check_format_installed, export_header, export_policy, output_paths
from shared.models import AtariTrunk

USAGE = "usage: python -m offpolicy.export checkpoint=<path> [format=torchscript|onnx] [out=PATH]"


class OnEnvObservations(nn.Module):
    """``policy`` on the observations the env gives: cast to ``dtype`` (float32 state vectors, as torchrl's
    DoubleToFloat does; uint8 images stay uint8) and, with ``obs_norm`` (the run's ObservationNorm statistics),
    standardised as ``(observation - loc) / scale``, what torchrl's ``ObservationNorm(standard_normal=True)`` computes
    (its transform acts on TensorDicts in an env, this module on tensors)."""

    def __init__(self, policy: nn.Module, dtype: torch.dtype, obs_norm: dict | None):
        super().__init__()
        self.policy, self.dtype, self.standardise = policy, dtype, obs_norm is not None
        if obs_norm is not None:
            self.register_buffer("loc", obs_norm["loc"].clone())
            self.register_buffer("scale", obs_norm["scale"].clone())

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        observation = observation.to(self.dtype)
        if self.standardise:
            observation = (observation - self.loc) / self.scale
        return self.policy(observation)


def in_float32(policy: nn.Module) -> nn.Module:
    """``policy`` with every conv trunk computing in float32 (a bf16-trained DQN's CNN): what runtimes without bf16
    kernels (onnxruntime's CPU convolutions) run."""
    for trunk in [m for m in policy.modules() if isinstance(m, AtariTrunk)]:
        trunk.precision = "float32"
    return policy


def observation_port(cfg, obs_spec) -> Port:
    """The exported policy's input: its shape, dtype and what it is, for the run's env."""
    from offpolicy.envs import atari_settings

    name = cfg.env.name
    if cfg.env.kind == "atari":
        what = atari_settings(cfg.env).describe_frames()
    elif cfg.env.from_pixels:
        what = (f"uint8 0-255 (scaled by 1/255 inside): the RGB camera image of {name} rendered at "
                f"{cfg.env.image_size}x{cfg.env.image_size}, channels first")
    else:
        source = "the task's observations concatenated in sorted key order" if cfg.env.kind == "dmc" else \
            "the Gymnasium observation"
        scaling = "standardised inside with the run's statistics (env.obs_norm)" if cfg.env.obs_norm else "used as is"
        what = f"float32 (other float dtypes are cast inside; ONNX takes float32): {source} of {name}, {scaling}"
    return Port("observation", what, tuple(obs_spec.shape), obs_spec.dtype)


def action_port(cfg, action_spec, discrete: bool) -> Port:
    """The exported policy's output, for the run's algorithm and env."""
    if discrete:
        return Port("action", f"int64: the index of the greedy action (argmax of {cfg.algo}'s Q values) among the "
                    f"env's {action_spec.shape[-1]} actions", extra={"n": int(action_spec.shape[-1])})
    low, high = action_spec.space.low, action_spec.space.high
    return Port("action", f"float32: {cfg.algo}'s deterministic action, within the env's bounds",
                extra={"low": low.tolist(), "high": high.tolist()})


def main(argv: list[str]) -> int:
    """Export a checkpoint's evaluation policy; prints where the file and its spec went."""
    from offpolicy import prepare_process
    from offpolicy.algos import algorithm
    from offpolicy.builder import Builder
    from offpolicy.checkpoint import Checkpoint
    from offpolicy.progress import Progress

    args = evaluate_cli_args(ExportConfig, export_header("offpolicy"), USAGE, argv, written_by="offpolicy.train")
    if args is None:
        return 0
    prepare_process()
    check_format_installed(args.format)
    checkpoint = Checkpoint.read(args.checkpoint, key="checkpoint")
    path, spec_path = output_paths(args)
    cfg = OmegaConf.create(checkpoint.config)
    env = Builder(cfg).eval_env()  # its specs: the networks' shapes, the observations' dtype, the action bounds
    try:
        obs_spec, action_spec = env.observation_spec_unbatched["observation"], env.action_spec_unbatched
        policy = in_float32(checkpoint.parts(env).eval_tensor_policy)  # the form its algorithm declares
    finally:
        env.close()
    observation, action = observation_port(cfg, obs_spec), action_port(cfg, action_spec, algorithm(cfg.algo).discrete)
    about = {"policy": f"{cfg.algo} on {cfg.env.name}", "produced_by": "offpolicy.export", "algo": cfg.algo,
             "env": cfg.env.name, "checkpoint": str(args.checkpoint),
             "env_steps_trained": Progress.from_state(checkpoint.counters).env_steps}
    export_policy(OnEnvObservations(policy, obs_spec.dtype, checkpoint.obs_norm), [observation], [action],
                  args.format, path, spec_path, about)
    return 0


if __name__ == "__main__":
    run_cli(main)
