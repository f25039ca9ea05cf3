"""A3C throughput on this machine, as JSON lines (figures, not a test).

    python benchmarks/a3c_throughput.py [seconds=30] [rounds=3] [workers=2] [any a3c key=value ...]

Every round measures all of these, one after the other; the ratios are taken within a round and their medians and
ranges over the rounds printed last (``median/...``).

(a) env_only       agent steps/s of W processes stepping the same Atari config with random actions
(b) model_cost     ms of model time per agent step (acting forward + update forward/backward), W processes at once
(c) roofline       the A3C rate (a) and (b) allow: W / (W / a + b), one core per worker
(c') worker_split  where a worker's time goes, µs per agent step: the real Rollout and A3CLearner with timers
                   around their parts (env, acting forward, the rest of the rollout, sync, GAE, trunk, loss,
                   backward, gradient copy, clip, optimizer step, statistics), W processes at once like (b)
(d) a3c            the real `python -m a3c.train` rate, steady state (start-up excluded)
(e) torchrl_loop   the same learner fed by torchrl's Collector over GymEnv + the torchrl transform stack, same model
(f) ikostrikov     ikostrikov/pytorch-a3c's design, W processes: one Pong game each (frame skip 4, no sticky actions),
                   42x42 running-normalised frames, its conv + LSTMCell(256) model, 20-step rollouts, summed losses,
                   clip 40, a shared Adam step (its train.py loop, written out here: its gym/universe/cv2 stack does
                   not install beside this Python; torch resizes the frames instead of cv2)
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # the a3c and shared packages, here and in the spawned processes
RESULTS = REPO / "benchmarks" / "results" / "a3c_throughput.jsonl"


def emit(metric: str, value: float, unit: str, **extra) -> None:
    line = json.dumps({"bench": "a3c_throughput", "metric": metric, "value": round(value, 4), "unit": unit, **extra})
    print(line, flush=True)
    with RESULTS.open("a") as f:
        f.write(line + "\n")


def _env_only(cfg_dict: dict, seconds: float, rank: int) -> float:
    from omegaconf import OmegaConf

    from shared.atari import AtariBatch, AtariSettings

    torch.set_num_threads(1)
    cfg = OmegaConf.create(cfg_dict)
    env = AtariBatch(AtariSettings.from_config(cfg.env), cfg.env.envs_per_worker, seed=rank)
    env.reset()
    rng = np.random.default_rng(rank)
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        env.step(rng.integers(0, env.num_actions, env.num_envs))
        steps += env.num_envs
    return steps / (time.perf_counter() - start)


def _model_cost_ms(cfg_dict: dict) -> dict[str, float]:
    """One thread's model time per agent step: forward at the acting batch (E), forward+backward at the update
    batch (E x t_max) in the layout the learner uses. Run in W processes at once, like the workers, so that (b)
    sees the same sharing of the machine as (a)."""
    from omegaconf import OmegaConf

    from a3c.model import build_model
    from shared.models import to_channels_last

    torch.set_num_threads(1)
    cfg = OmegaConf.create(cfg_dict)
    envs, t_max = cfg.env.envs_per_worker, cfg.a3c.t_max
    model = build_model(cfg, num_actions=6)
    channels = model.trunk.net[0].in_channels
    act_obs = torch.randint(0, 255, (envs, channels, cfg.env.image_size, cfg.env.image_size), dtype=torch.uint8)
    upd_obs = to_channels_last(act_obs.repeat(t_max, 1, 1, 1))
    with torch.no_grad():
        for _ in range(10):
            model(act_obs)
        start = time.perf_counter()
        for _ in range(200):
            logits, _ = model(act_obs)
            torch.multinomial(logits.softmax(-1), 1)
        forward = (time.perf_counter() - start) / (200 * envs)
    for _ in range(3):
        logits, value = model(upd_obs)
        (logits.sum() + value.sum()).backward()
    start = time.perf_counter()
    for _ in range(20):
        logits, value = model(upd_obs)
        (logits.sum() + value.sum()).backward()
    train = (time.perf_counter() - start) / (20 * len(upd_obs))
    return {"forward": forward * 1e3, "forward_backward": train * 1e3, "total": (forward + train) * 1e3}


def _worker_split(cfg_dict: dict, seconds: float, rank: int) -> dict[str, float]:
    """Seconds per agent step of each part of one worker's loop (sync, rollout, update, statistics, as
    ``a3c.worker.worker_main`` runs them): timers wrap the parts of the real objects, so the code measured is the
    code that trains; what no timer wraps inside the update (the loss's backward, the metrics) is its residual."""
    import collections

    from omegaconf import OmegaConf

    import a3c.learner
    from a3c.model import build_model
    from a3c.learner import A3CLearner
    from a3c.optim import make_shared_optimizer
    from a3c.rollout import Rollout
    from a3c.stats import SharedStats
    from shared.atari import AtariBatch, AtariSettings

    torch.set_num_threads(1)
    cfg = OmegaConf.create(cfg_dict)
    env = AtariBatch(AtariSettings.from_config(cfg.env), cfg.env.envs_per_worker, seed=rank)
    global_model = build_model(cfg, env.num_actions).share_memory()
    local = build_model(cfg, env.num_actions)
    optimizer = make_shared_optimizer(global_model.parameters(), cfg.optim)
    learner = A3CLearner.from_config(cfg, local, global_model, optimizer)
    rollout = Rollout(env, cfg.a3c.t_max)
    stats = SharedStats(1)
    totals: dict[str, float] = collections.defaultdict(float)

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                totals[name] += time.perf_counter() - start
        return wrapper

    env.step = timed("env", env.step)
    local.step = timed("act_forward", local.step)
    local.features = timed("trunk", local.features)
    learner.sync = timed("sync", learner.sync)
    learner.gae = timed("gae", learner.gae)
    learner.loss = timed("loss", learner.loss)
    optimizer.step = timed("optimizer_step", optimizer.step)
    a3c.learner.copy_gradients = timed("copy_gradients", a3c.learner.copy_gradients)
    torch.nn.utils.clip_grad_norm_ = timed("clip", torch.nn.utils.clip_grad_norm_)
    collect = timed("rollout", rollout.collect)
    update = timed("update", learner.update)
    add_progress = timed("stats", stats.add_progress)
    steps, start = 0, None
    while start is None or time.perf_counter() - start < seconds:
        if start is None and steps >= 5 * cfg.env.envs_per_worker * cfg.a3c.t_max:  # warm-up excluded
            totals.clear()
            steps, start = 0, time.perf_counter()
        learner.sync()
        batch, _ = collect(local)
        update(batch, rollout.start_state)
        add_progress(0, cfg.env.envs_per_worker * cfg.a3c.t_max * cfg.env.frame_skip, 1)
        steps += cfg.env.envs_per_worker * cfg.a3c.t_max
    env.close()
    wall = time.perf_counter() - start
    parts = {k: v / steps for k, v in totals.items()}
    parts["rollout_rest"] = parts.pop("rollout") - parts["env"] - parts["act_forward"]
    timed_in_update = ("gae", "trunk", "loss", "copy_gradients", "clip", "optimizer_step")
    parts["backward_and_rest"] = parts.pop("update") - sum(parts[k] for k in timed_in_update)
    parts["loop_rest"] = wall / steps - sum(parts.values())
    return parts


def real_a3c(argv: list[str], cfg, seconds: float) -> float:
    """Steady-state agent steps/s of the real trainer, from worker 0's logged counters (start-up excluded)."""
    from shared.logging import read_scalars

    with tempfile.TemporaryDirectory() as tmp:
        frames = int(seconds * 20_000)  # more than it can do: stopped by SIGINT below
        proc = subprocess.Popen([sys.executable, "-m", "a3c.train", *argv, f"total_frames={frames}",
                                 "eval.interval_frames=0", "eval.final_episodes=0", "logger.interval_s=2",
                                 f"run_dir={tmp}/run"], cwd=REPO, stdout=subprocess.DEVNULL)
        while not read_scalars(f"{tmp}/run", "time/elapsed_s")[0]:
            time.sleep(0.5)
        time.sleep(seconds)
        proc.send_signal(2)
        proc.wait()
        steps, elapsed = read_scalars(f"{tmp}/run", "time/elapsed_s")
        return (steps[-1] - steps[0]) / (elapsed[-1] - elapsed[0]) / cfg.env.frame_skip


def _torchrl_loop(cfg_dict: dict, seconds: float, rank: int) -> float:
    """The A3C update loop fed by torchrl's Collector: one GymEnv + transform stack per worker, same learner."""
    import torch.nn.functional as F
    from omegaconf import OmegaConf
    from tensordict.nn import TensorDictModule
    from torchrl.collectors import Collector
    from torchrl.envs import (CatFrames, Compose, GrayScale, GymEnv, NoopResetEnv, RewardSum, SignTransform,
                              StepCounter, ToTensorImage, TransformedEnv, UnaryTransform)

    from a3c.model import build_model
    from a3c.learner import A3CLearner
    from a3c.optim import make_shared_optimizer

    torch.set_num_threads(1)
    cfg = OmegaConf.create(cfg_dict)
    size = cfg.env.image_size

    def resize(x):  # torchrl's Resize needs torchvision, which cannot be installed beside this torch
        return F.interpolate(x.reshape(-1, *x.shape[-3:]), size=(size, size), mode="area").reshape(
            *x.shape[:-2], size, size)

    env = TransformedEnv(
        GymEnv("ALE/Pong-v5", frame_skip=cfg.env.frame_skip, repeat_action_probability=cfg.env.sticky_actions,
               categorical_action_encoding=True),
        Compose(NoopResetEnv(cfg.env.noop_max, random=True), RewardSum(), StepCounter(),
                SignTransform(in_keys=["reward"]), ToTensorImage(), GrayScale(),
                UnaryTransform(in_keys=["pixels"], out_keys=["pixels"], fn=resize),
                CatFrames(N=cfg.env.frame_stack, dim=-3)))
    global_model = build_model(cfg, env.action_spec.space.n)
    local = build_model(cfg, env.action_spec.space.n)
    optimizer = make_shared_optimizer(global_model.parameters(), cfg.optim)
    learner = A3CLearner.from_config(cfg, local, global_model, optimizer)

    def act(pixels):
        logits, value = local((pixels * 255).to(torch.uint8))
        return torch.multinomial(logits.softmax(-1), 1).squeeze(-1), value

    policy = TensorDictModule(act, in_keys=["pixels"], out_keys=["action", "state_value"])
    batch = cfg.env.envs_per_worker * cfg.a3c.t_max
    collector = Collector(env, policy, frames_per_batch=batch, total_frames=-1, auto_register_policy_transforms=False)
    steps, start = 0, None
    for data in collector:
        if start is None:  # first batch: start-up excluded, like (d)
            start = time.perf_counter()
            continue
        with torch.no_grad():
            data["next", "state_value"] = local((data["next", "pixels"] * 255).to(torch.uint8))[1]
        data["observation"] = (data["pixels"] * 255).to(torch.uint8)
        data["fire_forced"] = torch.zeros(*data.shape, 1, dtype=torch.bool)  # torchrl's stack forces no FIRE
        learner.update(data.unsqueeze(0))
        learner.sync()
        steps += batch
        if time.perf_counter() - start >= seconds:
            break
    collector.shutdown()
    return steps / (time.perf_counter() - start)


def _ikostrikov_loop(cfg_dict: dict, seconds: float, rank: int) -> float:
    """Agent steps/s of one process running ikostrikov/pytorch-a3c's worker loop (train.py, model.py, envs.py at
    its HEAD): sync, up to 20 single-game steps with the LSTM, n-step returns and GAE by hand, backward, clip 40,
    gradients handed to the shared model, a shared Adam step."""
    import ale_py
    import gymnasium as gym
    import torch.nn.functional as F
    from torch import nn

    from a3c.optim import SharedAdam

    torch.set_num_threads(1)
    torch.manual_seed(rank)

    class ActorCritic(nn.Module):  # ikostrikov's model.py (its init does not change the cost)
        def __init__(self, num_actions: int):
            super().__init__()
            self.convs = nn.ModuleList([nn.Conv2d(1 if i == 0 else 32, 32, 3, stride=2, padding=1) for i in range(4)])
            self.lstm = nn.LSTMCell(32 * 3 * 3, 256)
            self.critic_linear, self.actor_linear = nn.Linear(256, 1), nn.Linear(256, num_actions)

        def forward(self, x, state):
            for conv in self.convs:
                x = F.elu(conv(x))
            hx, cx = self.lstm(x.view(-1, 32 * 3 * 3), state)
            return self.critic_linear(hx), self.actor_linear(hx), (hx, cx)

    class Frames:  # envs.py: crop, resize to 80x80 then 42x42, grey, /255, running mean/std (alpha 0.999)
        def __init__(self):
            self.mean = self.std = 0.0
            self.n = 0

        def __call__(self, frame):
            x = torch.from_numpy(frame[34:194, :160]).permute(2, 0, 1).unsqueeze(0).float()
            x = F.interpolate(F.interpolate(x, size=(80, 80), mode="bilinear"), size=(42, 42), mode="bilinear")
            x = x.mean(1, keepdim=True) / 255.0
            self.n += 1
            self.mean = self.mean * 0.999 + float(x.mean()) * 0.001
            self.std = self.std * 0.999 + float(x.std()) * 0.001
            scale = 1 - 0.999 ** self.n
            return (x - self.mean / scale) / (self.std / scale + 1e-8)

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=4, repeat_action_probability=0.0)  # = PongDeterministic-v4
    frames = Frames()
    state = frames(env.reset(seed=rank)[0])
    shared, model = ActorCritic(env.action_space.n).share_memory(), ActorCritic(env.action_space.n)
    optimizer = SharedAdam(shared.parameters(), lr=1e-4)
    done, steps, start = True, 0, None
    gamma, tau = 0.99, 1.0
    while start is None or time.perf_counter() - start < seconds:
        if start is None and steps >= 200:  # warm-up excluded
            steps, start = 0, time.perf_counter()
        model.load_state_dict(shared.state_dict())
        hx, cx = (torch.zeros(1, 256), torch.zeros(1, 256)) if done else (hx.detach(), cx.detach())
        values, log_probs, rewards, entropies = [], [], [], []
        for _ in range(20):
            value, logit, (hx, cx) = model(state, (hx, cx))
            prob, log_prob = F.softmax(logit, -1), F.log_softmax(logit, -1)
            entropies.append(-(log_prob * prob).sum(1))
            action = prob.multinomial(1).detach()
            obs, reward, terminated, truncated, _ = env.step(int(action))
            done = terminated or truncated
            state = frames(env.reset()[0] if done else obs)
            values.append(value)
            log_probs.append(log_prob.gather(1, action))
            rewards.append(max(min(reward, 1), -1))
            steps += 1
            if done:
                break
        R = torch.zeros(1, 1) if done else model(state, (hx, cx))[0].detach()
        values.append(R)
        policy_loss = value_loss = 0
        gae = torch.zeros(1, 1)
        for i in reversed(range(len(rewards))):
            R = gamma * R + rewards[i]
            value_loss = value_loss + 0.5 * (R - values[i]).pow(2)
            gae = gae * gamma * tau + rewards[i] + gamma * values[i + 1].detach() - values[i].detach()
            policy_loss = policy_loss - log_probs[i] * gae - 0.01 * entropies[i]
        optimizer.zero_grad()
        (policy_loss + 0.5 * value_loss).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 40)
        for param, shared_param in zip(model.parameters(), shared.parameters()):
            shared_param.grad = param.grad
        optimizer.step()
    env.close()
    return steps / (time.perf_counter() - start)


def _parallel(fn, cfg_dict: dict, seconds: float, workers: int) -> float:
    with mp.get_context("spawn").Pool(workers) as pool:
        return sum(pool.starmap(fn, [(cfg_dict, seconds, rank) for rank in range(workers)]))


def measure_round(cfg, cfg_dict: dict, args: list[str], seconds: float, setting: dict) -> dict[str, float]:
    """One round of every figure, each part after the other; returns the round's rates and ratios."""
    workers = cfg.workers
    env_rate = _parallel(_env_only, cfg_dict, seconds, workers)
    emit("env_only", env_rate, "agent_steps/s", **setting)
    with mp.get_context("spawn").Pool(workers) as pool:
        costs = pool.map(_model_cost_ms, [cfg_dict] * workers)
    cost = {k: sum(c[k] for c in costs) / workers for k in costs[0]}
    emit("model_cost", cost["total"], "ms/agent_step", forward_ms=round(cost["forward"], 4),
         forward_backward_ms=round(cost["forward_backward"], 4), **setting)
    roofline = workers / (workers / env_rate + cost["total"] / 1e3)
    emit("roofline", roofline, "agent_steps/s", **setting)
    with mp.get_context("spawn").Pool(workers) as pool:
        splits = pool.starmap(_worker_split, [(cfg_dict, seconds, rank) for rank in range(workers)])
    for part in splits[0]:
        emit(f"worker_split/{part}", sum(s[part] for s in splits) / workers * 1e6, "us/agent_step", **setting)
    total = sum(sum(s.values()) for s in splits) / workers
    emit("worker_split/rate", workers / total, "agent_steps/s", **setting)
    a3c = real_a3c(args, cfg, seconds)
    emit("a3c", a3c, "agent_steps/s", fraction_of_roofline=round(a3c / roofline, 3), **setting)
    torchrl_rate = _parallel(_torchrl_loop, cfg_dict, seconds, workers)
    emit("torchrl_loop", torchrl_rate, "agent_steps/s", a3c_speedup=round(a3c / torchrl_rate, 2), **setting)
    ikostrikov_rate = _parallel(_ikostrikov_loop, cfg_dict, seconds, workers)
    emit("ikostrikov", ikostrikov_rate, "agent_steps/s", a3c_speedup=round(a3c / ikostrikov_rate, 2), **setting)
    return {"a3c": a3c, "roofline": roofline, "fraction_of_roofline": a3c / roofline,
            "speedup_vs_torchrl_loop": a3c / torchrl_rate, "speedup_vs_ikostrikov": a3c / ikostrikov_rate}


def main() -> None:
    """``rounds`` rounds (default 3) of every figure, then the median and range of each ratio over the rounds: this
    host's speed drifts by tens of percent within minutes, so a ratio is only taken within one round."""
    from omegaconf import OmegaConf

    from a3c.config import load_config

    os.environ["OMP_NUM_THREADS"] = "1"
    own = {"seconds": 30.0, "rounds": 3}
    args = []
    for arg in sys.argv[1:]:
        key, _, value = arg.partition("=")
        if key in own:
            own[key] = type(own[key])(value)
        else:
            args.append(arg)
    cfg = load_config(args)
    cfg_dict = OmegaConf.to_container(cfg, resolve=True)
    setting = {"workers": cfg.workers, "envs_per_worker": cfg.env.envs_per_worker, "t_max": cfg.a3c.t_max,
               "arch": cfg.model.arch, "cpus": os.cpu_count()}
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    rounds = [measure_round(cfg, cfg_dict, args, own["seconds"], {**setting, "round": i})
              for i in range(own["rounds"])]
    for name in rounds[0]:
        values = [r[name] for r in rounds]
        emit(f"median/{name}", statistics.median(values), "ratio" if "_" in name else "agent_steps/s",
             low=round(min(values), 4), high=round(max(values), 4), rounds=len(values), **setting)


if __name__ == "__main__":
    main()
