"""DQN (Mnih et al. 2015; double: van Hasselt et al. 2016; dueling: Wang et al. 2016) on torchrl's ``DQNLoss``:
epsilon-greedy collection, a hard or soft target Q network. Discrete actions: CartPole, ALE games (Nature CNN)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from offpolicy.algos import networks as nets
from offpolicy.algos.base import AlgoParts, Algorithm
from offpolicy.algos.policies import EpsilonGreedyPolicy, GreedyQ
from offpolicy.network_updates import OptimGroup
from shared.models import CONV_PRECISIONS, conv_precision
from shared.schema import key


def build(cfg, env, device) -> AlgoParts:
    from torchrl.modules import EGreedyModule, QValueActor
    from torchrl.objectives import DQNLoss

    obs_spec, action_spec = nets.specs(env)
    precision = conv_precision(cfg.dqn.conv_precision, device.type)
    qnet = QValueActor(nets.q_network(cfg.model, obs_spec, action_spec.shape[-1], cfg.dqn.dueling, precision),
                       in_keys=["observation"], spec=action_spec)
    greedy = EGreedyModule(action_spec, eps_init=cfg.dqn.eps_init, eps_end=cfg.dqn.eps_end,
                           annealing_num_steps=cfg.dqn.eps_anneal_env_steps)
    loss = nets.with_value_estimator(cfg.loss, DQNLoss(qnet, loss_function=cfg.loss.function, delay_value=True,
                                                  double_dqn=cfg.dqn.double, action_space=action_spec))
    optimizer = nets.network_adam(cfg.optim, cfg.compile, loss.value_network_params.flatten_keys().values(), "actor")
    return AlgoParts(
        collect_policy=EpsilonGreedyPolicy(qnet, greedy, action_spec.shape[-1]), eval_policy=qnet,
        eval_tensor_policy=GreedyQ(qnet), exploration=greedy, loss=loss,
        groups=[OptimGroup("q", optimizer, ("loss",), cfg.optim.max_grad_norm)],
        target_updater=nets.target_updater(cfg.target, loss), exploration_value=lambda: float(greedy.eps),
        discrete=True,
        describe=f"Q network CNN in {precision} (dqn.conv_precision={cfg.dqn.conv_precision})"
        if obs_spec.dtype == torch.uint8 else "",
    )

@dataclass
class DQNConfig(nets.EpsilonGreedyConfig):
    """DQN's section"""
    double: bool = key(False, "double DQN target (van Hasselt et al. 2016)")
    dueling: bool = key(False, "dueling Q head (Wang et al. 2016): value and advantage streams with their own last "
                               "hidden layer, Q = V + A - mean(A); on Atari two 512-unit streams after the convolutions")
    conv_precision: str = key("auto", "Atari frames: the Nature CNN's compute precision. auto: bfloat16 where the "
                                      "learner's device computes it natively (a CPU with AVX512-BF16 or AMX, a CUDA GPU "
                                      "with bf16), else float32. bf16 runs the convolutions and the 512-unit layer "
                                      "under autocast (parameters, Q head, loss and Adam stay float32; exported files "
                                      "compute in float32); `profile=atari_cleanrl` sets float32, CleanRL's own; see "
                                      "[results.md](results.md)", choices=CONV_PRECISIONS)


ALGORITHM = Algorithm(name="dqn", discrete=True, smoke_env="CartPole-v1", build=build, config=DQNConfig,
                      shape_keys=("dqn.dueling",))
