"""The algorithm registry (offpolicy/algos/): every module declares itself completely, nothing outside the package
names an algorithm, and CrossQ and REDQ do what their papers say on top of torchrl's losses."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from offpolicy.algos import ALGORITHMS, ALGOS, algorithm
from offpolicy.builder import Builder
from offpolicy.config import CONFIG_DIR, compose_config
from offpolicy.envs import make_train_env
from offpolicy.learner import make_learner

REPO = Path(__file__).resolve().parent.parent


def _optimiser_steps(optimizer) -> int:
    """Steps Adam has taken (its per-parameter step count)."""
    return int(next(iter(optimizer.state.values()))["step"]) if optimizer.state else 0


@pytest.mark.parametrize("name", ALGOS)
def test_every_algorithm_declares_its_name_yaml_rules_and_smoke_env(name):
    algo = algorithm(name)
    assert algo.name == name and (CONFIG_DIR / "algo" / f"{name}.yaml").is_file()
    cfg, _ = compose_config([f"algo={name}", f"env={algo.smoke_env}", "profile=smoke"])
    for key in algo.rules:
        assert OmegaConf.select(cfg, key) is not None, f"{name}'s rule {key} names no key of its config"
    for key in (*algo.added_keys, *algo.shape_keys, *algo.renamed_keys.values()):
        assert OmegaConf.select(cfg, key) is not None, key
    env = make_train_env(cfg)
    parts = Builder(cfg).parts(env)
    assert parts.discrete == algo.discrete
    assert {g.name for g in parts.groups} >= ({"q"} if algo.discrete else {"actor", "critic"})


def test_no_module_outside_the_algorithm_package_names_an_algorithm():
    """Adding an algorithm touches its module and its yaml only: the loop, the learner, the engines, the config
    checks and the tools never branch on (or list) an algorithm's name or read its config section."""
    names = "|".join(ALGOS)
    pattern = re.compile(rf"""["'](?:{names})["']|\b(?:{names})\.\w+|algo\s*[!=]=""")
    offenders = []
    for path in [*REPO.glob("offpolicy/*.py"), *REPO.glob("offpolicy/engines/*.py")]:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line.split("#")[0]):
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


def test_redq_draws_two_of_ten_critics_for_each_target(monkeypatch):
    """The target minimum runs over ``sub_sample_len`` critics drawn by ``torch.randperm(num_qvalue_nets)``."""
    cfg, parts, learner, batch = _learner("redq")
    draws = []
    real = torch.randperm

    def recording(n, *args, **kwargs):
        out = real(n, *args, **kwargs)
        draws.append(n)
        return out

    monkeypatch.setattr(torch, "randperm", recording)
    learner.step(batch.clone())
    assert draws == [10]


def test_adding_an_algorithm_needs_no_registry_edit():
    """The registry is every module of the package but its shared ones."""
    package = REPO / "offpolicy" / "algos"
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "base", "networks", "policies"}
    assert set(ALGORITHMS) == modules == {"dqn", "sac", "td3", "ddpg", "crossq", "redq"}


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
