"""Networks shared by both engines: Atari conv trunks, the pixel encoder, the Atari actor-critic, MLP builders."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn


class ReLU(nn.Module):
    """``max(x, 0)`` as ``nn.ReLU``; under ``torch.compile`` written as ``x * clamp_min(sign(x), 0)``: the same values
    (-0.0 for negative inputs) and the same gradients, without a boolean mask. Why: torch 2.13's inductor on CPU saves
    relu's backward mask as a bool tensor, and its bool-store kernel is slow on AVX-512 CPUs, slow enough to show in
    SAC's whole compiled learner step (docs/results.md, "Off-policy engine"; benchmarks/offpolicy_update_cost.py)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return x * torch.sign(x).clamp_min(0)
        return torch.relu(x)


def chained_forward(module: nn.Module):
    """``module``'s forward as its layers' own ``forward`` methods called in turn, for a network that is a chain of
    ``nn.Sequential`` containers (an ``nn.Identity`` is skipped; any other module is one layer, called as it is):
    the same arithmetic without ``nn.Module.__call__`` around every layer. Why: at batch 1 (acting in one env copy)
    that call machinery is a large part of a small MLP's forward (CartPole's [120, 84] Q network).
    Forward hooks would be skipped, so a module with any (its own, a submodule's or global ones) gets its ordinary
    call instead."""
    from shared import compat

    if compat.has_forward_hooks(module):
        return module

    def layers(m: nn.Module) -> list[nn.Module]:
        if isinstance(m, nn.Sequential):
            return [leaf for child in m for leaf in layers(child)]
        return [] if isinstance(m, nn.Identity) else [m]

    steps = [layer.forward for layer in layers(module)]

    def forward(x: torch.Tensor) -> torch.Tensor:
        for step in steps:
            x = step(x)
        return x

    return forward


CONV_PRECISIONS = ("auto", "float32", "bfloat16")


def conv_precision(choice: str, device_type: str) -> str:
    """The compute precision of a conv trunk (:class:`AtariTrunk`) for the config's ``choice`` on a ``device_type``
    (``cpu`` or ``cuda``) device: ``auto`` is bfloat16 where that device computes it natively (a CPU with AVX512-BF16
    or AMX, a CUDA GPU with bf16), else float32 (emulated bf16 would be slower than float32)."""
    from shared import compat

    if choice != "auto":
        return choice
    if device_type == "cuda":
        native = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    else:
        native = device_type == "cpu" and compat.cpu_computes_bf16_natively()
    return "bfloat16" if native else "float32"


def _orthogonal(module: nn.Module, gain: float) -> nn.Module:
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
    return module


class AtariTrunk(nn.Module):
    """Conv trunk over uint8 frames ``[..., C, H, W]`` (scaled to [0, 1] inside) -> features ``[..., out_features]``.

    ``arch="nature"``: the Nature-DQN CNN (32-64-64 convs, 512 units). ``arch="small"``: the 2013 DQN CNN used by the
    A3C paper (16-32 convs, 256 units), several times cheaper per sample on CPU. ``dense=False`` stops after the convolutions
    (the flattened feature map), for heads with dense layers of their own (:class:`DuelingHead`).
    ``channels_last=True`` runs the convolutions in channels-last layout whatever the input's (weights and input
    converted): it speeds up the bare network's float32 update and costs nothing in acting or in the whole learner
    step (docs/results.md, "DQN on Atari (Pong)"; benchmarks/atari_dqn_update_cost.py).
    ``precision="bfloat16"`` runs the convolutions and the dense layer under bfloat16 autocast on the input's device
    (the parameters stay float32, the features come back float32, so a head and the loss on them are float32): the
    Nature CNN's DQN update markedly faster on a CPU with AVX512-BF16, best in the default layout (docs/results.md,
    "DQN on Atari (Pong)"); features within ~2^-8 of float32's.
    """

    ARCHS = ("nature", "small")

    def __init__(self, in_channels: int, image_size: int = 84, arch: str = "nature", dense: bool = True,
                 channels_last: bool = False, precision: str = "float32"):
        super().__init__()
        if precision not in ("float32", "bfloat16"):
            raise ValueError(f"unknown precision {precision!r}; allowed: float32, bfloat16")
        self.precision = precision
        if arch == "nature":
            convs = [(32, 8, 4), (64, 4, 2), (64, 3, 1)]
            self.out_features = 512
        elif arch == "small":
            convs = [(16, 8, 4), (32, 4, 2)]
            self.out_features = 256
        else:
            raise ValueError(f"unknown trunk {arch!r}; allowed: {', '.join(self.ARCHS)}")
        layers: list[nn.Module] = []
        channels, size = in_channels, image_size
        for out_channels, kernel, stride in convs:
            layers += [nn.Conv2d(channels, out_channels, kernel, stride), ReLU()]
            channels, size = out_channels, (size - kernel) // stride + 1
        if size < 1:
            raise ValueError(f"image_size={image_size} is too small for the {arch} trunk")
        layers.append(nn.Flatten())
        if dense:
            layers += [nn.Linear(channels * size * size, self.out_features), ReLU()]
        else:
            self.out_features = channels * size * size
        self.net = _orthogonal(nn.Sequential(*layers), nn.init.calculate_gain("relu"))
        self.channels_last = channels_last
        if channels_last:
            self.net.to(memory_format=torch.channels_last)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """Features of ``frames``; the convolutions follow the input's memory format (see ``to_channels_last``)."""
        batch = frames.shape[:-3]
        x = frames.reshape(-1, *frames.shape[-3:])
        if self.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        x = x.float().div_(255.0)  # .float() keeps the memory format
        if self.precision == "bfloat16":
            with torch.autocast(x.device.type, dtype=torch.bfloat16):
                features = self.net(x)
            return features.float().reshape(*batch, self.out_features)
        return self.net(x).reshape(*batch, self.out_features)


class PixelEncoder(AtariTrunk):
    """Conv encoder for camera-image observations (``make_env(..., from_pixels=True)``): uint8 ``[..., C, H, W]``
    (any leading batch dims, scaled by 1/255 inside) -> float features ``[..., out_features]``.

    The :class:`AtariTrunk` convolutions sized for ``image_size``; at 64x64 the Nature CNN ends on a 4x4x64 map
    (512 features) and the small one on 6x6x32 (256 features).
    """

    def __init__(self, in_channels: int = 3, image_size: int = 64, arch: str = "nature"):
        super().__init__(in_channels, image_size, arch)


class DuelingHead(nn.Module):
    """Dueling Q head (Wang et al. 2016): ``features -> Q = V + A - mean(A)`` from a value stream and an advantage
    stream, each with its own hidden layer of ``hidden`` units. Why our own: torchrl 0.14.1's ``DuelingCnnDQNet``
    builds lazy layers (no parameters before a first forward, so the optimisers and a resumed checkpoint built ahead of
    it fail) and it has no MLP counterpart."""

    def __init__(self, in_features: int, n_actions: int, hidden: int, activation: type[nn.Module] = ReLU):
        super().__init__()
        self.value = mlp(in_features, 1, (hidden,), activation)
        self.advantage = mlp(in_features, n_actions, (hidden,), activation)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        advantage = self.advantage(features)
        return self.value(features) + advantage - advantage.mean(-1, keepdim=True)


def to_channels_last(frames: torch.Tensor) -> torch.Tensor:
    """``[N, C, H, W]`` frames in channels-last layout: on this CPU it cuts the conv forward+backward of a training
    batch (80 frames) by ~25 %, while small acting batches (8 frames) are faster in the default layout."""
    return frames.contiguous(memory_format=torch.channels_last)


RecurrentState = tuple[torch.Tensor, torch.Tensor]  # an LSTM's (h, c), each [batch, lstm_size]


class AtariActorCritic(nn.Module):
    """Shared conv trunk with a categorical policy head (logits) and a state-value head; with ``recurrent="lstm"`` an
    LSTM cell of ``lstm_size`` units between the trunk and the heads (the A3C paper's recurrent agent: the small
    trunk, then an LSTM of 256).

    Acting goes through :meth:`step` (a recurrent state in and out; ``None`` for the feed-forward model), training
    through :meth:`features` (the heads' input for a whole rollout, the LSTM unrolled over it)."""

    RECURRENT = ("lstm",)

    def __init__(self, num_actions: int, in_channels: int, image_size: int = 84, arch: str = "nature",
                 recurrent: str | None = None, lstm_size: int = 256):
        super().__init__()
        if recurrent not in (None, *self.RECURRENT):
            raise ValueError(f"unknown recurrent core {recurrent!r}; allowed: null, {', '.join(self.RECURRENT)}")
        self.trunk = AtariTrunk(in_channels, image_size, arch)
        self.lstm = nn.LSTMCell(self.trunk.out_features, lstm_size) if recurrent == "lstm" else None
        if self.lstm is not None:  # forget gate bias 1 (Jozefowicz et al. 2015), the rest zero
            nn.init.zeros_(self.lstm.bias_ih)
            nn.init.zeros_(self.lstm.bias_hh)
            self.lstm.bias_ih.data[lstm_size:2 * lstm_size] = 1.0
        width = lstm_size if self.lstm is not None else self.trunk.out_features
        self.policy_head = _orthogonal(nn.Linear(width, num_actions), 0.01)
        self.value_head = _orthogonal(nn.Linear(width, 1), 1.0)

    @property
    def recurrent(self) -> bool:
        return self.lstm is not None

    def initial_state(self, batch: int) -> RecurrentState | None:
        """The state a new game (or life) starts from: zeros; ``None`` for the feed-forward model."""
        if self.lstm is None:
            return None
        zeros = torch.zeros(batch, self.lstm.hidden_size)
        return zeros, zeros.clone()

    def step(self, frames: torch.Tensor, state: RecurrentState | None) -> tuple[torch.Tensor, torch.Tensor,
                                                                            RecurrentState | None]:
        """One acting step on ``frames`` ``[B, C, H, W]``: ``(logits, value, next state)``."""
        hidden = self.trunk(frames)
        if self.lstm is not None:
            state = self.lstm(hidden, state)
            hidden = state[0]
        return self.policy_head(hidden), self.value_head(hidden), state

    def features(self, frames: torch.Tensor, state: RecurrentState | None = None,
                 is_init: torch.Tensor | None = None) -> torch.Tensor:
        """The heads' input. Feed-forward: the trunk's features of ``frames`` (any leading dims). Recurrent:
        ``frames`` ``[E, T, C, H, W]`` is a rollout, the trunk runs on all of it at once and the LSTM is unrolled over
        its ``T`` steps from ``state`` (where the rollout started), back to zeros before every step where ``is_init``
        ``[E, T]`` (a new game or life): truncated backprop through time over the rollout."""
        hidden = self.trunk(frames)
        if self.lstm is None:
            return hidden
        h, c = state
        outputs = []
        for t in range(frames.shape[1]):
            keep = (~is_init[:, t]).unsqueeze(-1).to(h.dtype)
            h, c = self.lstm(hidden[:, t], (h * keep, c * keep))
            outputs.append(h)
        return torch.stack(outputs, 1)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logits, value)`` of the feed-forward model."""
        if self.lstm is not None:
            raise TypeError("a recurrent AtariActorCritic acts through step() with its state")
        hidden = self.trunk(frames)
        return self.policy_head(hidden), self.value_head(hidden)


def torchrl_actor_critic(model: AtariActorCritic):
    """Wrap the heads of an :class:`AtariActorCritic` as torchrl modules sharing its parameters.

    Returns ``(actor, critic)``: a categorical ``ProbabilisticActor`` and a ``ValueOperator``, both reading
    ``"hidden"`` (:meth:`AtariActorCritic.features`, computed once per batch), so a loss that calls both runs the trunk
    (and the LSTM) once.
    """
    from tensordict.nn import TensorDictModule
    from torchrl.modules import ProbabilisticActor, ValueOperator
    from torch.distributions import Categorical

    actor = ProbabilisticActor(
        TensorDictModule(model.policy_head, in_keys=["hidden"], out_keys=["logits"]),
        in_keys=["logits"],
        distribution_class=Categorical,
        return_log_prob=False,
    )
    critic = ValueOperator(model.value_head, in_keys=["hidden"])
    return actor, critic


def mlp(
    in_features: int,
    out_features: int,
    hidden: Sequence[int] = (256, 256),
    activation: type[nn.Module] = ReLU,
) -> nn.Sequential:
    """A plain MLP: ``in -> hidden... -> out`` with ``activation`` between layers (none after the last)."""
    layers: list[nn.Module] = []
    width = in_features
    for size in hidden:
        layers += [nn.Linear(width, size), activation()]
        width = size
    layers.append(nn.Linear(width, out_features))
    return nn.Sequential(*layers)
