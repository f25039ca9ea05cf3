"""Optimizers whose state lives in shared memory, and the gradient hand-over from a worker to the global model.

torch's own Adam/RMSprop create their state lazily inside each process; for Hogwild-style A3C every worker must
update one shared state, so these subclasses create it eagerly and move it to shared memory. The update rule is
torch's own (``step`` is inherited), which keeps them step-for-step identical to ``torch.optim.Adam``/``RMSprop``.
"""
from __future__ import annotations

from typing import Iterable

import torch
from torch import nn


class _SharedStateMixin:
    def _init_shared_state(self, initial: dict[str, float] | None = None) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                # torch keeps `step` as a float32 scalar tensor on CPU; shared, so every worker counts the same steps
                state["step"] = torch.zeros((), dtype=torch.float32)
                for name in self._state_buffers(group):
                    state[name] = torch.full_like(p, (initial or {}).get(name, 0.0),
                                                  memory_format=torch.preserve_format)
        self.share_memory()

    def share_memory(self) -> "_SharedStateMixin":
        """Move every state tensor to shared memory (call again after ``load_state_dict``)."""
        for state in self.state.values():
            for value in state.values():
                if torch.is_tensor(value):
                    value.share_memory_()
        return self

    def load_state_dict(self, state_dict) -> None:
        super().load_state_dict(state_dict)
        self.share_memory()


class SharedAdam(_SharedStateMixin, torch.optim.Adam):
    """``torch.optim.Adam`` with its moments and step counts in shared memory."""

    def __init__(self, params: Iterable[nn.Parameter], **kwargs):
        super().__init__(params, **kwargs)
        self._init_shared_state()

    def _state_buffers(self, group) -> list[str]:
        return ["exp_avg", "exp_avg_sq"] + (["max_exp_avg_sq"] if group["amsgrad"] else [])


class SharedRMSprop(_SharedStateMixin, torch.optim.RMSprop):
    """``torch.optim.RMSprop`` (the A3C paper's optimizer) with its statistics in shared memory.

    ``initial_square_avg``: where the running average of squared gradients starts. torch starts it at 0, so the
    first steps divide by ``sqrt(1 - alpha^k)`` of the gradient's size: ~10x ``lr`` and sign-like at ``alpha`` 0.99.
    TensorFlow's RMSProp (OpenAI baselines' A2C/ACKTR, whose lr 7e-4 and alpha 0.99 these defaults are) starts it at 1,
    so its first steps are small and it warms up over ~1/(1 - alpha) steps."""

    def __init__(self, params: Iterable[nn.Parameter], initial_square_avg: float = 0.0, **kwargs):
        super().__init__(params, **kwargs)
        self._init_shared_state({"square_avg": initial_square_avg})

    def _state_buffers(self, group) -> list[str]:
        names = ["square_avg"]
        if group["momentum"] > 0:
            names.append("momentum_buffer")
        if group["centered"]:
            names.append("grad_avg")
        return names


def make_shared_optimizer(params: Iterable[nn.Parameter], optim) -> torch.optim.Optimizer:
    """SharedAdam or SharedRMSprop from the ``optim`` config section."""
    if optim.name == "adam":
        return SharedAdam(params, lr=optim.lr, eps=optim.eps, weight_decay=optim.weight_decay)
    if optim.name == "rmsprop":
        return SharedRMSprop(params, lr=optim.lr, eps=optim.eps, alpha=optim.rmsprop_alpha,
                             weight_decay=optim.weight_decay, initial_square_avg=optim.rmsprop_initial_square_avg)
    raise ValueError(f"optim.name={optim.name!r}; allowed: adam, rmsprop")


def copy_gradients(local: nn.Module, global_model: nn.Module) -> None:
    """Copy the local gradients into the global parameters' ``.grad``.

    A copy, never an alias: ikostrikov/pytorch-a3c (and torchrl PR #3001) set ``global.grad = local.grad``, so on
    torch >= 2 ``zero_grad(set_to_none=True)`` on the global optimizer drops only the global reference and the local
    gradients keep accumulating across updates.
    """
    for local_p, global_p in zip(local.parameters(), global_model.parameters()):
        if local_p.grad is None:
            global_p.grad = None
        elif global_p.grad is None:
            global_p.grad = local_p.grad.clone()
        else:
            global_p.grad.copy_(local_p.grad)
