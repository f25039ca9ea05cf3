"""The algorithm registry (offpolicy/algos/): every module declares itself completely, nothing outside the package
names an algorithm, and CrossQ and REDQ do what their papers say on top of torchrl's losses."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch
from offpolicy_helpers import smoke_parts
from omegaconf import OmegaConf

from offpolicy.algos import ALGORITHMS, ALGOS, algorithm
from offpolicy.builder import Builder
from offpolicy.config import CONFIG_DIR, compose_config
from offpolicy.envs import make_train_env
from offpolicy.learner import make_learner
from shared import schema

REPO = Path(__file__).resolve().parent.parent


def _optimiser_steps(optimizer) -> int:
    """Steps Adam has taken (its per-parameter step count)."""
    return int(next(iter(optimizer.state.values()))["step"]) if optimizer.state else 0


@pytest.mark.parametrize("name", ALGOS)
def test_every_algorithm_declares_its_name_yaml_section_and_smoke_env(name):
    algo = algorithm(name)
    assert algo.name == name and (CONFIG_DIR / "algo" / f"{name}.yaml").is_file()
    cfg, _ = compose_config([f"algo={name}", f"env={algo.smoke_env}", "profile=smoke"])
    for key in schema.rules(algo.config, f"{name}."):
        assert OmegaConf.select(cfg, key) is not None, f"{name}'s rule {key} names no key of its config"
    for key in algo.shape_keys:
        assert OmegaConf.select(cfg, key) is not None, key
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    assert parts.discrete == algo.discrete
    assert {g.name for g in parts.groups} >= ({"q"} if algo.discrete else {"actor", "critic"})


def test_no_module_outside_the_algorithm_package_names_an_algorithm():
    """Adding an algorithm touches its module and its yaml only: the loop, the learner, the engines, the config
    checks and the tools never branch on (or list) an algorithm's name or read its config section. Exempt: the
    checkpoint migrations' tables of an old format's keys (``V0_*``), fixed history that a new algorithm never joins."""
    names = "|".join(ALGOS)
    pattern = re.compile(rf"""["'](?:{names})["']|\b(?:{names})\.\w+|algo\s*[!=]=""")
    offenders = []
    for path in [*REPO.glob("offpolicy/*.py"), *REPO.glob("offpolicy/engines/*.py")]:
        source = path.read_text()
        old_format = {number for node in ast.parse(source).body if isinstance(node, ast.Assign)
                      and any(isinstance(t, ast.Name) and re.fullmatch(r"V\d+_\w+", t.id) for t in node.targets)
                      for number in range(node.lineno, node.end_lineno + 1)}
        for number, line in enumerate(source.splitlines(), 1):
            if number not in old_format and pattern.search(line.split("#")[0]):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def _learner(name: str, *overrides: str):
    cfg, _ = compose_config([f"algo={name}", "env=Pendulum-v1", "profile=smoke", *overrides])
    env = make_train_env(cfg)
    torch.manual_seed(0)
    parts = Builder(cfg).parts(env)
    learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(cfg.optim.batch_size,))
    batch = env.rollout(200).reshape(-1)[: cfg.optim.batch_size]
    return cfg, parts, learner, batch


def test_crossq_has_no_targets_and_batch_renormalised_critics_that_see_both_pairs_at_once():
    from torchrl.modules import BatchRenorm1d

    cfg, parts, learner, batch = _learner("crossq")
    assert parts.target_updater is None and learner.state_dict()["target_updates"] == 0
    norms = [m for m in parts.loss.qvalue_network.modules() if isinstance(m, BatchRenorm1d)]
    assert len(norms) == len(cfg.model.hidden) + 1  # on the input and after each hidden layer (as SBX's CrossQ)
    seen = []
    parts.loss.qvalue_network.register_forward_pre_hook(lambda module, args: seen.append(args[0].batch_size[0]))
    running = parts.loss.qvalue_network_params.flatten_keys()
    means = {k: v.clone() for k, v in running.items() if k.endswith("running_mean")}
    assert means
    delay = cfg.crossq.policy_delay
    for _ in range(2 * delay):
        learner.step(batch.clone())
    b = cfg.optim.batch_size
    # the critic step's forward: current and next pairs concatenated (2B); the actor's: B (critics in eval mode)
    assert 2 * b in seen and b in seen
    after = parts.loss.qvalue_network_params.flatten_keys()
    assert all(not torch.equal(means[k], after[k]) for k in means)  # batch statistics were updated
    steps = {g.name: _optimiser_steps(g.optimizer) for g in parts.groups}
    assert steps == {"critic": 2 * delay, "actor": 2, "alpha": 2}
    assert dict(parts.groups[0].optimizer.param_groups[0])["betas"] == (cfg.crossq.adam_beta1, 0.999)


def test_redq_trains_an_ensemble_with_soft_targets_and_the_actor_once_per_env_step():
    cfg, parts, learner, batch = _learner("redq")
    loss = parts.loss
    n = cfg.redq.num_qvalue_nets
    assert n == 10 and cfg.redq.sub_sample_len == 2 and cfg.optim.utd_ratio == 20
    assert all(v.shape[0] == n for v in loss.qvalue_network_params.flatten_keys().values())
    assert float(loss.min_log_alpha.exp()) < 1e-6  # torchrl's default floor of 0.1 is off
    online = loss.qvalue_network_params.flatten_keys()
    target = loss.target_qvalue_network_params.flatten_keys()
    before = {k: target[k].clone() for k in target.keys()}
    assert all(torch.equal(before[k], online[k]) for k in before)
    for _ in range(40):
        learner.step(batch.clone())
    steps = {g.name: _optimiser_steps(g.optimizer) for g in parts.groups}
    assert steps == {"critic": 40, "actor": 2, "alpha": 2}  # UTD 20: the actor once per collected env step
    for k in before:  # the targets moved, by tau per step, and did not become the online networks
        assert not torch.equal(before[k], target[k]) and not torch.equal(target[k], online[k])
    # every critic trained: each one's weights left its start
    first = [k for k in online.keys() if k.endswith("weight")][0]
    assert all(not torch.equal(online[first][i], before[first][i]) for i in range(n))


def _critic_values(loss, params, observation, action):
    """Q values [K, B] of the K critics stacked in ``params``, one plain forward each (no vmap)."""
    values = []
    for i in range(params.batch_size[0]):
        with params[i].to_module(loss.qvalue_network):
            values.append(loss.qvalue_network.module(observation, action).squeeze(-1))
    return torch.stack(values)


def _recording_policy(monkeypatch, loss):
    """Record every ``(observation, action, log_prob)`` the REDQ loss samples."""
    calls = []
    real = loss._policy

    def recording(params, observation):
        action, log_prob = real(params, observation)
        calls.append((observation, action.detach(), log_prob.detach()))
        return action, log_prob

    monkeypatch.setattr(loss, "_policy", recording)
    return calls


def test_redq_target_is_the_minimum_over_critics_drawn_afresh_each_step(monkeypatch):
    """Each step draws its own ``sub_sample_len`` of the ten target critics, and the target is ``r + gamma^k (1 -
    terminated) (min over the drawn critics of Q'(s', a') - alpha log pi(a'|s'))``, computed here critic by critic
    (``k``: n-step replay's ``steps_to_next_obs``, which torchrl 0.14.1's REDQLoss dropped)."""
    cfg, _, parts, batch = smoke_parts("redq")
    batch["steps_to_next_obs"] = torch.randint(1, 4, (batch.shape[0], 1))
    loss = parts.loss
    n, m, gamma = cfg.redq.num_qvalue_nets, cfg.redq.sub_sample_len, cfg.loss.gamma
    # targets apart from the online critics and from each other, so that which critics are drawn matters
    with torch.no_grad():
        for value in loss.target_qvalue_network_params.flatten_keys().values():
            value.add_(torch.randn_like(value) * 0.5)
    sampled = _recording_policy(monkeypatch, loss)
    subsets = []
    for _ in range(6):
        sampled.clear()
        _, metadata = loss.qvalue_loss(batch.clone())
        drawn = metadata["drawn"]
        subsets.append(tuple(drawn.tolist()))
        assert len(set(subsets[-1])) == m and all(0 <= i < n for i in subsets[-1])
        (next_observation, next_action, next_log_prob), = sampled
        assert torch.equal(next_observation, batch["next", "observation"])
        with torch.no_grad():
            q = _critic_values(loss, loss.target_qvalue_network_params, next_observation, next_action)
        next_value = q[drawn].min(0).values - loss.alpha * next_log_prob
        assert not torch.allclose(next_value, q.min(0).values - loss.alpha * next_log_prob)  # not all ten
        not_terminated = 1 - batch["next", "terminated"].squeeze(-1).float()
        discount = gamma ** batch["steps_to_next_obs"].squeeze(-1)
        expected = batch["next", "reward"].squeeze(-1) + discount * not_terminated * next_value
        torch.testing.assert_close(metadata["target_value"], expected, rtol=1e-5, atol=1e-5)
    assert len(set(subsets)) > 1  # drawn afresh (six equal draws of 2 of 10: probability 45^-5)


def test_redq_temperature_loss_uses_the_current_states_actions_only(monkeypatch):
    """The paper's temperature loss: ``-alpha (log pi(a|s) + target entropy)`` averaged over the batch's current
    states, at the actions sampled there (torchrl 0.14.1's REDQLoss also averaged in the next states' ones)."""
    _, _, parts, batch = smoke_parts("redq", "redq.alpha_init=0.5")
    loss = parts.loss
    sampled = _recording_policy(monkeypatch, loss)
    out = loss(batch.clone())
    current = [log_prob for observation, _, log_prob in sampled if torch.equal(observation, batch["observation"])]
    assert len(sampled) == 2 and len(current) == 1
    # the log-probability of the sampled actions, recomputed from the actor's distribution at the current states
    _, action, _ = next(c for c in sampled if torch.equal(c[0], batch["observation"]))
    with torch.no_grad():
        log_prob = loss.actor_network.distribution(batch["observation"]).log_prob(action)
    torch.testing.assert_close(log_prob, current[0], rtol=1e-4, atol=1e-4)
    target_entropy = -1.0  # "auto": minus Pendulum's one action dimension
    assert float(loss.target_entropy) == target_entropy
    expected = -0.5 * (log_prob + target_entropy).mean()
    assert out["loss_alpha"].item() == pytest.approx(float(expected), rel=1e-4)
    both = -0.5 * (torch.cat([c[2] for c in sampled]) + target_entropy).mean()
    assert out["loss_alpha"].item() != pytest.approx(float(both), rel=1e-3)  # the batch tells them apart


def _flops(fn, *args) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return counter.get_total_flops()


def test_redq_critic_only_steps_skip_the_actor_term_and_make_the_same_updates():
    """At UTD 20, 19 of 20 steps train only the critics: they run the critics' term alone (N + M critic passes and
    one actor pass per sample, counted in multiply-adds) instead of the whole loss (2N + M critic passes: the actor's
    term runs its actions through all N critics), and end with the same networks, step for step, as a learner that
    runs the whole loss every step."""
    from dataclasses import replace

    cfg, env, parts, batch = smoke_parts("redq", "optim.batch_size=32")
    loss, n, m, b = parts.loss, cfg.redq.num_qvalue_nets, cfg.redq.sub_sample_len, 32

    def row_flops(network):
        return sum(2 * layer.in_features * layer.out_features for layer in network.modules()
                   if isinstance(layer, torch.nn.Linear))

    critic, actor = row_flops(loss.qvalue_network), row_flops(loss.actor_network)
    sample = batch[:b]
    assert _flops(loss.qvalue_loss, sample.clone()) == b * ((n + m) * critic + actor)
    assert _flops(loss.forward, sample.clone()) == b * ((2 * n + m) * critic + 2 * actor)

    _, _, whole_parts, _ = smoke_parts("redq", "optim.batch_size=32")  # the same seed: the same networks
    whole_parts = replace(whole_parts, critic_only=None)
    learners = [make_learner(cfg, p, env.action_spec_unbatched, sample_shape=(b,)) for p in (parts, whole_parts)]
    forwards = {id(p.loss): 0 for p in (parts, whole_parts)}
    for p in (parts, whole_parts):
        real = p.loss.forward

        def counting(tensordict, real=real, key=id(p.loss)):
            forwards[key] += 1
            return real(tensordict)

        p.loss.forward = counting
    utd = int(cfg.optim.utd_ratio)
    for step in range(utd):
        sample = batch[torch.randperm(batch.shape[0])[:b]]
        for learner in learners:
            torch.manual_seed(step)
            learner.step(sample.clone())
    assert forwards == {id(parts.loss): 1, id(whole_parts.loss): utd}
    for key, value in parts.loss.state_dict().items():
        assert torch.equal(value, whole_parts.loss.state_dict()[key]), key
    for name, optimizer in parts.optimizers.items():
        assert _optimiser_steps(optimizer) == _optimiser_steps(whole_parts.optimizers[name])


def test_redq_rejects_a_subset_as_large_as_the_ensemble(capsys):
    """torchrl caps ``sub_sample_len`` at N - 1 without a word: the config check says so instead."""
    from shared.config import ConfigError, run_cli

    from offpolicy.train import main

    with pytest.raises(ConfigError, match=r"^redq.sub_sample_len=10 is out of range; allowed: an integer from 1 to "
                                          r"redq.num_qvalue_nets - 1 = 9$"):
        compose_config(["algo=redq", "redq.sub_sample_len=10"])
    compose_config(["algo=redq", "redq.sub_sample_len=4", "redq.num_qvalue_nets=5"])  # the largest allowed
    with pytest.raises(SystemExit) as exited:
        run_cli(main, ["algo=redq", "redq.num_qvalue_nets=3", "redq.sub_sample_len=3"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: redq.sub_sample_len=3 is out of range; allowed: an integer from 1 to redq.num_qvalue_nets - 1 = 2"]


def test_clamped_batch_renorm_ends_its_warm_up():
    """The renormalisation factor (read off the output: with momentum 0 the running statistics stay at 0 and 1, so
    the output's mean is the factor times d = clamp(batch mean)) goes 0, 0, then 1 for ever with warmup_steps=2;
    torchrl 0.14.1's own class goes 0, 0, 1, 1, 2, 2, 3, ... A counter restored from a checkpoint of that class
    (far past the warm-up) gives 1 too."""
    from offpolicy.algos.networks import ClampedBatchRenorm1d

    torch.manual_seed(0)
    x = torch.randn(64, 4) * 2 + 3
    layer = ClampedBatchRenorm1d(4, momentum=0.0, warmup_steps=2)
    d = x.mean(0).clamp(-layer.max_d, layer.max_d)  # running mean 0, running std ~1
    factors, stds = [], []
    with torch.no_grad():
        for _ in range(12):
            out = layer(x)
            factors.append(round(float((out.mean(0) / d).mean()), 3))
            stds.append(out.std(0))
    assert factors == [0.0, 0.0] + [1.0] * 10
    assert all(torch.allclose(std, stds[2]) for std in stds[2:])  # the output's statistics stay put
    assert int(layer.num_batches_tracked) <= layer.warmup_steps + 1
    layer.num_batches_tracked.fill_(50)
    with torch.no_grad():
        assert float((layer(x).mean(0) / d).mean()) == pytest.approx(1.0, abs=1e-3)


def test_double_dqn_evaluates_the_online_argmax_with_the_target_network():
    """``dqn.double=true``: the target is ``r + gamma (1 - terminated) Q_target(s', argmax_a Q_online(s', a))``;
    ``false``: ``... max_a Q_target(s', a)``. With the target network's actions swapped the two differ (double DQN's
    is then min_a Q_online(s', a)), and each run's TD error (the loss writes ``(Q(s, a) - target)^2``) matches its own hand computation."""
    targets = {}
    for double in (True, False):
        cfg, _, parts, batch = smoke_parts("dqn", f"dqn.double={str(double).lower()}")
        loss = parts.loss
        with torch.no_grad():
            # the target network's output layer with its two actions swapped: Q_target(s, a) = Q_online(s, 1 - a)
            target_params = loss.target_value_network_params.flatten_keys()
            for suffix in ("weight", "bias"):
                last = [k for k in target_params.keys() if k.endswith(suffix)][-1]
                target_params[last].copy_(target_params[last].flip(0))
            sample = batch.clone()
            loss(sample)

            def q_values(params, observation):
                with params.to_module(loss.value_network):
                    return loss.value_network.module[0](observation)  # QValueActor: the Q network, then argmax

            online = q_values(loss.value_network_params, batch["next", "observation"])
            target = q_values(loss.target_value_network_params, batch["next", "observation"])
            q_taken = (q_values(loss.value_network_params, batch["observation"]) * batch["action"]).sum(-1)
        next_value = target.gather(-1, online.argmax(-1, keepdim=True)).squeeze(-1) if double else target.max(-1).values
        not_terminated = 1 - batch["next", "terminated"].squeeze(-1).float()
        targets[double] = batch["next", "reward"].squeeze(-1) + cfg.loss.gamma * not_terminated * next_value
        torch.testing.assert_close(sample["td_error"].squeeze(-1), (q_taken - targets[double]) ** 2)
    different = (targets[True] - targets[False]).abs() > 1e-3
    assert different.float().mean() > 0.9  # wherever the two Q values differ


def test_adding_an_algorithm_needs_no_registry_edit():
    """The registry is every module of the package but its shared ones."""
    package = REPO / "offpolicy" / "algos"
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "base", "networks", "policies"}
    assert set(ALGORITHMS) == modules and len(modules) >= 6


@pytest.mark.parametrize("name,shape_override", [("crossq", "crossq.policy_delay=2"),
                                                 ("redq", "redq.num_qvalue_nets=5")])
def test_new_algorithms_resume_exactly_and_keep_their_shapes(tmp_path, name, shape_override, capsys):
    """A checkpoint of CrossQ (no target networks, batch-renormalisation statistics) or REDQ (an ensemble) resumes
    with its networks, optimisers and counters; changing REDQ's ensemble size on resume is one error line."""
    from offpolicy_helpers import train_inprocess

    from shared.checkpoint import load_checkpoint
    from shared.config import ConfigError

    args = (f"algo={name}", "env=Pendulum-v1", "profile=smoke", "eval.interval_env_steps=0", "eval.final_episodes=0",
            "optim.utd_ratio=0.5")
    first = train_inprocess(*args, "total_env_steps=300", f"run_dir={tmp_path}")
    assert first["status"] == "completed" and first["optim_steps"] == 100
    path = tmp_path / "checkpoints" / "last.pt"
    saved = load_checkpoint(path)["learner"]
    second = train_inprocess(f"resume={path}", "total_env_steps=500")
    assert second["status"] == "completed" and second["optim_steps"] == 100 + 50  # replay refilled: one batch idle
    after = load_checkpoint(path)["learner"]
    assert after["steps"] == 150 and set(after["optimizers"]) == set(saved["optimizers"])
    assert after["loss"].keys() == saved["loss"].keys()
    if name == "redq":
        with pytest.raises(ConfigError, match="redq.num_qvalue_nets=5 differs from the resumed run's"):
            compose_config([f"resume={path}", shape_override])


def test_annealing_in_one_update_reaches_torchrls_step_by_step_values():
    """``anneal(module, k)`` moves epsilon-greedy, Gaussian and OU exploration where torchrl's ``step(k)`` (k updates)
    moves it, down to the end value and no further."""
    from torchrl.data import Bounded, OneHot
    from torchrl.modules import AdditiveGaussianModule, EGreedyModule, OrnsteinUhlenbeckProcessModule

    from offpolicy.algos.base import anneal

    box = Bounded(-1.0, 1.0, (3,))
    for make, name, end in [
        (lambda: EGreedyModule(OneHot(2), eps_init=1.0, eps_end=0.05, annealing_num_steps=2500), "eps", 0.05),
        (lambda: AdditiveGaussianModule(box, sigma_init=0.2, sigma_end=0.05, annealing_num_steps=2500), "sigma", 0.05),
        (lambda: OrnsteinUhlenbeckProcessModule(box, eps_init=1.0, eps_end=0.25, annealing_num_steps=2500), "eps", 0.25),
    ]:
        stepped, annealed = make(), make()
        for env_steps in (1, 999, 1000, 1000, 700):
            stepped.step(env_steps)
            anneal(annealed, env_steps)
            assert float(getattr(annealed, name)) == pytest.approx(float(getattr(stepped, name)), abs=1e-4), name
        assert float(getattr(annealed, name)) == pytest.approx(end)
