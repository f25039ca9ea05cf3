"""DQN's conv precision on Atari (``dqn.conv_precision``): the Nature CNN under bfloat16 autocast with float32
parameters, head and loss; ``auto`` picks bfloat16 only where the learner's device computes it natively."""
from __future__ import annotations

import pytest
import torch
from offpolicy_helpers import smoke_parts

from offpolicy.learner import make_learner
from shared import compat
from shared.config import ConfigError
from shared.models import AtariTrunk, conv_precision


def test_auto_is_bfloat16_only_where_the_device_computes_it_natively(monkeypatch):
    monkeypatch.setattr(compat, "cpu_computes_bf16_natively", lambda: True)
    assert conv_precision("auto", "cpu") == "bfloat16"
    monkeypatch.setattr(compat, "cpu_computes_bf16_natively", lambda: False)
    assert conv_precision("auto", "cpu") == "float32"
    assert conv_precision("bfloat16", "cpu") == "bfloat16" and conv_precision("float32", "cpu") == "float32"
    if not torch.cuda.is_available():
        assert conv_precision("auto", "cuda") == "float32"


def test_auto_asks_about_the_learners_device(monkeypatch):
    """DQN's build asks ``conv_precision`` about the device its learner runs on, which the builder hands it (the
    engine's learner device: the CPU locally and with Gloo, CUDA with NCCL, so a CPU-only driver never picks bf16 for
    a GPU learner from its own CPU flags)."""
    from omegaconf import OmegaConf

    from offpolicy.algos import dqn
    from offpolicy.engines import engine_class

    def device(engine, backend):
        return engine_class(engine).learner_device(OmegaConf.create({"engine": engine, "ray": {"backend": backend}}))

    assert [device("local", "nccl"), device("ray", "gloo"), device("ray", "nccl")] == [
        torch.device("cpu"), torch.device("cpu"), torch.device("cuda")]
    asked = []
    monkeypatch.setattr(dqn, "conv_precision", lambda choice, device_type: asked.append(device_type) or "float32")
    cfg, env, _, _ = smoke_parts("dqn", "env=Pong", "replay.size=300")
    assert asked == ["cpu"]
    from offpolicy.builder import Builder

    Builder(cfg).parts(env, torch.device("cuda"))  # a learner rank on a GPU (nothing is moved there here)
    assert asked == ["cpu", "cuda"]


def test_a_bf16_trunk_computes_in_bf16_and_keeps_float32_features_parameters_and_gradients():
    torch.manual_seed(0)
    full = AtariTrunk(4, 84, "nature")
    half = AtariTrunk(4, 84, "nature", precision="bfloat16")
    half.load_state_dict(full.state_dict())
    frames = torch.randint(0, 256, (8, 4, 84, 84), dtype=torch.uint8)
    expected, features = full(frames), half(frames)
    assert features.dtype == torch.float32 and features.shape == (8, 512)
    error = ((features - expected).norm() / expected.norm()).item()
    assert 0 < error < 0.02  # bf16 really ran (not bit-equal), within a few bf16 roundings of float32
    features.sum().backward()
    assert all(p.dtype == p.grad.dtype == torch.float32 for p in half.parameters())
    with pytest.raises(ValueError, match="precision"):
        AtariTrunk(4, 84, "nature", precision="float16")


def _trunk(parts) -> AtariTrunk:
    return next(m for m in parts.eval_policy.modules() if isinstance(m, AtariTrunk))


@pytest.mark.parametrize("precision, channels_last", [("bfloat16", False), ("float32", True)])
def test_the_atari_q_network_follows_dqn_conv_precision(precision, channels_last):
    """bf16 runs in the default layout (faster there), float32 channels-last; the Q values are float32 either way."""
    _, _, parts, batch = smoke_parts("dqn", "env=Pong", "replay.size=300", f"dqn.conv_precision={precision}")
    trunk = _trunk(parts)
    assert (trunk.precision, trunk.channels_last) == (precision, channels_last)
    with torch.no_grad():
        assert parts.eval_policy(batch[:4].clone())["action_value"].dtype == torch.float32


def test_conv_precision_is_checked_and_profiles_set_it():
    from offpolicy.config import compose_config

    with pytest.raises(ConfigError, match="dqn.conv_precision"):
        compose_config(["algo=dqn", "dqn.conv_precision=float16"])
    assert compose_config(["algo=dqn", "profile=atari"])[0].dqn.conv_precision == "auto"
    assert compose_config(["algo=dqn", "profile=atari_cleanrl"])[0].dqn.conv_precision == "float32"


def test_a_compiled_bf16_learner_tracks_the_eager_one_without_recompiling():
    """The compiled bf16 update on Pong frames: no recompilation after its warm-up, and the same losses and weights as
    the eager bf16 update within bf16's rounding (inductor may round the casts in another order)."""
    common = ("env=Pong", "replay.size=300", "dqn.conv_precision=bfloat16", "optim.batch_size=8")
    results, batch = {}, None
    for compiled in (False, True):  # the same initial weights (seed 0); both learn on the eager run's batch
        cfg, env, parts, collected = smoke_parts("dqn", *common, f"compile.enabled={str(compiled).lower()}")
        batch = collected if batch is None else batch
        learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(8,))
        initial = {k: v.detach().clone() for k, v in parts.loss.value_network_params.flatten_keys().items()}
        replay = type("Replay", (), {"sample": lambda self, n: batch[torch.arange(n) % batch.numel()].clone()})()
        out = learner.update(replay, learner.warmup_steps + 2, version=1)
        results[compiled] = (out, dict(parts.loss.value_network_params.flatten_keys().items()), learner)
    (eager, eager_params, _), (compiled, compiled_params, learner) = results[False], results[True]
    assert compiled["compile/recompiles"] == 0
    assert compiled["loss/loss"] == pytest.approx(eager["loss/loss"], rel=0.05)
    for key, value in eager_params.items():  # Adam turns rounding-sized gradient differences into lr-sized steps on a
        # few weights (4 of 32,768 of the first conv's), so each tensor's whole update is compared
        eager_update, compiled_update = value - initial[key], compiled_params[key] - initial[key]
        assert eager_update.norm() > 0 and (compiled_update - eager_update).norm() < 0.1 * eager_update.norm(), key
