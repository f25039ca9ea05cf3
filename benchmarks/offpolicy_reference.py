"""Plain-PyTorch reference for benchmarks/offpolicy_throughput.py: the same training work as our off-policy engine
does in its benchmark cases, written the CleanRL way (sac_continuous_action.py, td3_continuous_action.py,
ddpg_continuous_action.py, dqn.py): one ``gymnasium.make`` env, act with the current policy, ``env.step``, write the
transition into a preallocated torch ring buffer, then run the updates; no tensordict, no torchrl, torch's default
number of threads. offpolicy_throughput.py runs it in a fresh process next to each engine case, so the engine's
figure has a baseline measured on the same machine in the same run (``ratio_to_reference``).

    python benchmarks/offpolicy_reference.py sac|td3|ddpg|dqn [steps=N] [prefill=N] [seed=N] [utd=X] [batch=N]
                                             [hidden=256,256]

Settings (those of the engine's cases): SAC, TD3, DDPG on HalfCheetah-v5 with [256, 256] ReLU MLPs, batch 256, one
update per env step, gamma 0.99, soft targets (tau 0.005) after every update, Adam actor 3e-4 / critic 1e-3. SAC: two
Q nets, tanh-Gaussian actor, learned alpha (target entropy -action_dim, lr 1e-3), actor updated every step. TD3:
exploration noise 0.1, policy delay 2 (actor and targets every 2nd critic step), target smoothing 0.2 clipped at 0.5.
DDPG: one critic, exploration noise 0.2, actor every step. Noise std is in units of half the action range. DQN on
CartPole-v1 at CleanRL's setting by default: [120, 84] Q net, batch 128, one update per 10 env steps, Adam 2.5e-4,
hard target copy every 500 env steps, epsilon 1.0 -> 0.04 over 8000 steps (utd/batch/hidden can be changed).

``prefill`` policy steps (no updates) come first; the figures are over the ``steps`` learning-phase steps that follow
(time.perf_counter): env steps/s and updates/s. Prints JSON lines like the other benchmarks; appends nothing.
"""
from __future__ import annotations

import copy
import json
import sys
import time

import gymnasium as gym
import torch
import torch.nn.functional as F
from torch import nn

GAMMA, TAU = 0.99, 0.005
DEFAULTS = {  # env, utd, batch, hidden
    "sac": ("HalfCheetah-v5", 1.0, 256, (256, 256)),
    "td3": ("HalfCheetah-v5", 1.0, 256, (256, 256)),
    "ddpg": ("HalfCheetah-v5", 1.0, 256, (256, 256)),
    "dqn": ("CartPole-v1", 0.1, 128, (120, 84)),
}


def mlp(n_in: int, hidden, n_out: int) -> nn.Sequential:
    layers, width = [], n_in
    for h in hidden:
        layers += [nn.Linear(width, h), nn.ReLU()]
        width = h
    return nn.Sequential(*layers, nn.Linear(width, n_out))


class Replay:
    """Ring buffer of preallocated tensors: obs, action, reward, next_obs, terminated."""

    def __init__(self, size: int, obs_dim: int, action_shape: tuple, action_dtype: torch.dtype):
        self.obs = torch.zeros(size, obs_dim)
        self.next_obs = torch.zeros(size, obs_dim)
        self.action = torch.zeros(size, *action_shape, dtype=action_dtype)
        self.reward = torch.zeros(size)
        self.terminated = torch.zeros(size)
        self.size, self.pos, self.full = size, 0, False

    def add(self, obs, action, reward, next_obs, terminated) -> None:
        i = self.pos
        self.obs[i], self.action[i], self.reward[i] = obs, action, reward
        self.next_obs[i], self.terminated[i] = next_obs, terminated
        self.pos = (i + 1) % self.size
        self.full = self.full or self.pos == 0

    def sample(self, batch: int):
        idx = torch.randint(self.size if self.full else self.pos, (batch,))
        return self.obs[idx], self.action[idx], self.reward[idx], self.next_obs[idx], self.terminated[idx]


def soft_update(target: nn.Module, source: nn.Module, tau: float = TAU) -> None:
    with torch.no_grad():
        for t, s in zip(target.parameters(), source.parameters()):
            t.lerp_(s, tau)


class QNet(nn.Module):
    """Q(s, a) of a continuous action: an MLP over [obs, action]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden):
        super().__init__()
        self.net = mlp(obs_dim + act_dim, hidden, 1)

    def forward(self, obs, action):
        return self.net(torch.cat([obs, action], 1)).squeeze(1)


class DetActor(nn.Module):
    """TD3 / DDPG actor: tanh output scaled to the action bounds."""

    def __init__(self, obs_dim: int, scale, bias, hidden):
        super().__init__()
        self.net = mlp(obs_dim, hidden, len(scale))
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    def forward(self, obs):
        return torch.tanh(self.net(obs)) * self.scale + self.bias


class GaussActor(nn.Module):
    """SAC actor: the net outputs loc and scale (softplus, 1 at 0 as torchrl's NormalParamExtractor); tanh-squashed
    to the action bounds. Returns a sampled action and its log-probability."""

    def __init__(self, obs_dim: int, scale, bias, hidden):
        super().__init__()
        self.net = mlp(obs_dim, hidden, 2 * len(scale))
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)

    def forward(self, obs):
        loc, raw = self.net(obs).chunk(2, -1)
        normal = torch.distributions.Normal(loc, F.softplus(raw + 0.5413) + 1e-4)
        u = normal.rsample()
        y = torch.tanh(u)
        log_prob = (normal.log_prob(u) - torch.log(self.scale * (1 - y.pow(2)) + 1e-6)).sum(-1)
        return y * self.scale + self.bias, log_prob


def _bounds(env):
    low, high = (torch.as_tensor(b, dtype=torch.float32) for b in (env.action_space.low, env.action_space.high))
    return (high - low) / 2, (high + low) / 2


def sac(env, rb: Replay, batch: int, hidden):
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    actor = GaussActor(obs_dim, *_bounds(env), hidden)
    qs = nn.ModuleList([QNet(obs_dim, act_dim, hidden) for _ in range(2)])
    qs_target = copy.deepcopy(qs)
    log_alpha = torch.zeros(1, requires_grad=True)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    q_opt = torch.optim.Adam(qs.parameters(), lr=1e-3)
    alpha_opt = torch.optim.Adam([log_alpha], lr=1e-3)
    target_entropy = -float(act_dim)

    def act(obs, step):
        with torch.no_grad():
            return actor(obs[None])[0][0]

    def update():
        obs, action, reward, next_obs, term = rb.sample(batch)
        alpha = log_alpha.exp().detach()
        with torch.no_grad():
            next_action, next_logp = actor(next_obs)
            next_q = torch.min(*(q(next_obs, next_action) for q in qs_target)) - alpha * next_logp
            target = reward + GAMMA * (1 - term) * next_q
        q_loss = sum(F.mse_loss(q(obs, action), target) for q in qs)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()

        pi, logp = actor(obs)
        actor_loss = (alpha * logp - torch.min(*(q(obs, pi) for q in qs))).mean()
        actor_opt.zero_grad()
        actor_loss.backward()
        actor_opt.step()
        alpha_loss = -(log_alpha * (logp.detach() + target_entropy)).mean()
        alpha_opt.zero_grad()
        alpha_loss.backward()
        alpha_opt.step()
        soft_update(qs_target, qs)

    return act, update


def td3(env, rb: Replay, batch: int, hidden, twin: bool = True, noise: float = 0.1, policy_delay: int = 2,
        target_noise: float = 0.2, noise_clip: float = 0.5):
    """TD3; with ``twin=False, noise=0.2, policy_delay=1, target_noise=0`` it is DDPG."""
    obs_dim, act_dim = env.observation_space.shape[0], env.action_space.shape[0]
    scale, bias = _bounds(env)
    actor = DetActor(obs_dim, scale, bias, hidden)
    qs = nn.ModuleList([QNet(obs_dim, act_dim, hidden) for _ in range(2 if twin else 1)])
    actor_target, qs_target = copy.deepcopy(actor), copy.deepcopy(qs)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    q_opt = torch.optim.Adam(qs.parameters(), lr=1e-3)
    low, high = bias - scale, bias + scale
    n_updates = 0

    def act(obs, step):
        with torch.no_grad():
            action = actor(obs[None])[0]
        return (action + torch.randn(act_dim) * scale * noise).clamp(low, high)

    def update():
        nonlocal n_updates
        obs, action, reward, next_obs, term = rb.sample(batch)
        with torch.no_grad():
            next_action = actor_target(next_obs)
            if target_noise:
                smoothing = (torch.randn_like(next_action) * target_noise).clamp(-noise_clip, noise_clip)
                next_action = (next_action + smoothing * scale).clamp(low, high)
            next_q = torch.min(torch.stack([q(next_obs, next_action) for q in qs_target]), 0).values
            target = reward + GAMMA * (1 - term) * next_q
        q_loss = sum(F.mse_loss(q(obs, action), target) for q in qs)
        q_opt.zero_grad()
        q_loss.backward()
        q_opt.step()

        n_updates += 1
        if n_updates % policy_delay == 0:
            actor_loss = -qs[0](obs, actor(obs)).mean()
            actor_opt.zero_grad()
            actor_loss.backward()
            actor_opt.step()
            soft_update(actor_target, actor)
            soft_update(qs_target, qs)

    return act, update


def ddpg(env, rb: Replay, batch: int, hidden):
    return td3(env, rb, batch, hidden, twin=False, noise=0.2, policy_delay=1, target_noise=0.0)


def dqn(env, rb: Replay, batch: int, hidden, utd: float, eps_end: float = 0.04, eps_steps: int = 8000,
        target_every: int = 500):
    q = mlp(env.observation_space.shape[0], hidden, env.action_space.n)
    q_target = copy.deepcopy(q)
    opt = torch.optim.Adam(q.parameters(), lr=2.5e-4)
    copy_every = max(1, round(target_every * utd))  # updates in target_every env steps
    n_updates = 0

    def act(obs, step):
        eps = max(eps_end, 1.0 - (1.0 - eps_end) * step / eps_steps)
        if torch.rand(()) < eps:
            return torch.randint(env.action_space.n, ())
        with torch.no_grad():
            return q(obs[None])[0].argmax()

    def update():
        nonlocal n_updates
        obs, action, reward, next_obs, term = rb.sample(batch)
        with torch.no_grad():
            target = reward + GAMMA * (1 - term) * q_target(next_obs).max(1).values
        loss = F.mse_loss(q(obs).gather(1, action[:, None]).squeeze(1), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        n_updates += 1
        if n_updates % copy_every == 0:
            q_target.load_state_dict(q.state_dict())

    return act, update


def run(algo: str, steps: int, prefill: int = 1000, seed: int = 0, utd: float | None = None,
        batch: int | None = None, hidden: tuple[int, ...] | None = None) -> dict:
    """``prefill`` policy steps, then ``steps`` learning steps with ``utd`` updates per step (default: the engine
    case's settings, see DEFAULTS); returns the learning phase's ``env_steps_per_s`` and ``updates_per_s``."""
    env_id, default_utd, default_batch, default_hidden = DEFAULTS[algo]
    utd, batch, hidden = utd or default_utd, batch or default_batch, tuple(hidden or default_hidden)
    torch.manual_seed(seed)
    env = gym.make(env_id)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)
    rb = Replay(prefill + steps, env.observation_space.shape[0], () if discrete else env.action_space.shape,
                torch.int64 if discrete else torch.float32)
    if algo == "dqn":
        act, update = dqn(env, rb, batch, hidden, utd)
    else:
        act, update = {"sac": sac, "td3": td3, "ddpg": ddpg}[algo](env, rb, batch, hidden)

    obs = torch.as_tensor(env.reset(seed=seed)[0], dtype=torch.float32)
    n_updates = 0
    for step in range(prefill + steps):
        if step == prefill:
            start = time.perf_counter()
        action = act(obs, step)
        next_obs, reward, terminated, truncated, _ = env.step(action.item() if discrete else action.numpy())
        next_obs = torch.as_tensor(next_obs, dtype=torch.float32)
        rb.add(obs, action, float(reward), next_obs, float(terminated))
        obs = torch.as_tensor(env.reset()[0], dtype=torch.float32) if terminated or truncated else next_obs
        if step >= prefill:
            # updates due after (step - prefill + 1) learning steps: 1 per step at utd 1, every 10th step at 0.1
            due = int((step - prefill + 1) * utd + 1e-9)
            while n_updates < due:
                update()
                n_updates += 1
    wall = time.perf_counter() - start
    env.close()
    return {"env_steps_per_s": steps / wall, "updates_per_s": n_updates / wall, "steps": steps,
            "updates": n_updates, "wall_s": wall}


def main(argv: list[str]) -> None:
    algo = next((a for a in argv if "=" not in a), "sac")
    kv = dict(a.split("=", 1) for a in argv if "=" in a)
    hidden = tuple(int(h) for h in kv["hidden"].strip("[]()").split(",")) if "hidden" in kv else None
    r = run(algo, int(kv.get("steps", 5000)), prefill=int(kv.get("prefill", 1000)), seed=int(kv.get("seed", 0)),
            utd=float(kv["utd"]) if "utd" in kv else None, batch=int(kv["batch"]) if "batch" in kv else None,
            hidden=hidden)
    for metric, unit in (("env_steps_per_s", "steps/s"), ("updates_per_s", "updates/s")):
        print(json.dumps({"bench": f"offpolicy_reference/{algo}", "metric": metric, "value": round(r[metric], 1),
                          "unit": unit}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
