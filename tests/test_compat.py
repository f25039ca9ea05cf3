"""One test per entry of shared/compat.py (the private attributes of our dependencies that we still touch), so an
upgrade that breaks one fails here, under its name."""
from __future__ import annotations

import os

import pytest
import torch
from tensordict import TensorDict, TensorDictBase

from shared import compat


def test_fast_from_any_returns_plain_tensors_and_still_converts_the_rest():
    compat.fast_from_any()
    compat.fast_from_any()  # idempotent
    t = torch.zeros(3)
    assert TensorDict.from_any(t) is t
    converted = TensorDict.from_any({"a": torch.ones(2)})  # not a tensor: tensordict's own conversion
    assert isinstance(converted, TensorDictBase) and torch.equal(converted["a"], torch.ones(2))


def test_cpu_computes_bf16_natively_agrees_with_the_cpu_flags():
    answer = compat.cpu_computes_bf16_natively()
    assert isinstance(answer, bool)
    if os.path.exists("/proc/cpuinfo"):  # Linux names the instruction sets among the CPU's flags
        flags = set(open("/proc/cpuinfo").read().split())
        assert answer == bool({"avx512_bf16", "amx_tile"} & flags)


def test_has_forward_hooks_sees_module_submodule_and_global_hooks():
    net = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    assert not compat.has_forward_hooks(net)
    handles = [net[0].register_forward_hook(lambda *_: None)]
    assert compat.has_forward_hooks(net)
    handles[0].remove()
    handles = [net.register_forward_pre_hook(lambda *_: None)]
    assert compat.has_forward_hooks(net)
    handles[0].remove()
    handles = [torch.nn.modules.module.register_module_forward_hook(lambda *_: None)]
    assert compat.has_forward_hooks(net)
    handles[0].remove()
    assert not compat.has_forward_hooks(net)


def _memmap_buffer(path):
    from torchrl.data import LazyMemmapStorage, TensorDictReplayBuffer

    return TensorDictReplayBuffer(storage=LazyMemmapStorage(100, scratch_dir=str(path), existsok=True))


def test_memmap_replay_state_leaves_out_the_data_and_reopens_the_files(tmp_path):
    replay = _memmap_buffer(tmp_path)
    data = TensorDict({"x": torch.arange(10.0).unsqueeze(-1)}, batch_size=[10])
    replay.extend(data)
    state = compat.replay_state_without_data(replay.state_dict())
    assert compat.STORAGE_KEY not in state[compat.STORAGE_KEY]  # no copy of the transitions in the checkpoint
    reopened = _memmap_buffer(tmp_path)
    compat.reopen_memmap_replay(reopened, tmp_path, state)
    assert len(reopened) == 10 and reopened.write_count == 10
    assert torch.equal(reopened.storage.get(torch.arange(10))["x"], data["x"])


def test_replay_write_cursor_and_state_write_count_follow_the_ring(tmp_path):
    replay = _memmap_buffer(tmp_path)  # capacity 100
    for _ in range(3):
        replay.extend(TensorDict({"x": torch.zeros(40, 1)}, batch_size=[40]))
    assert compat.replay_write_cursor(replay) == 20  # 120 writes into 100 slots
    assert compat.replay_state_write_count(replay.state_dict()) == 120 == replay.write_count


def test_prioritized_sampler_builds_our_trees_and_checkpoints_them_as_tensors():
    from offpolicy.replay.prioritized import TorchPrioritizedSampler, TorchSegmentTree

    sampler = TorchPrioritizedSampler(8, alpha=1.0, beta=1.0)
    sum_tree, min_tree = sampler.trees()
    assert isinstance(sum_tree, TorchSegmentTree) and isinstance(min_tree, TorchSegmentTree)
    sampler.update_priority(torch.arange(4), torch.tensor([1.0, 2.0, 3.0, 4.0]))
    state = sampler.state_dict()
    assert all(isinstance(state[k], torch.Tensor) for k in compat.PrioritizedTreesHook.TREES)
    restored = TorchPrioritizedSampler(8, alpha=1.0, beta=1.0)
    restored.load_state_dict(state)
    assert torch.equal(restored.trees()[0].values, sum_tree.values)
    assert restored.trees()[1].values[:4].tolist() == min_tree.values[:4].tolist()


def test_prioritized_sampler_draws_from_the_buffers_generator_or_torchs():
    """SamplerOnTorchRNG: torchrl's ReplayBuffer hands its generator to the sampler's private ``_rng`` and
    PrioritizedSampler.sample draws from it; without one the draws follow torch's default generator (torchrl would
    use numpy's global RNG)."""
    from torchrl.data import LazyTensorStorage, ReplayBuffer

    from offpolicy.replay.prioritized import TorchPrioritizedSampler

    def draws(generator=None):
        rb = ReplayBuffer(storage=LazyTensorStorage(50), sampler=TorchPrioritizedSampler(50, alpha=1.0, beta=1.0),
                          batch_size=64, generator=generator)
        rb.extend(torch.arange(50))  # each item is its own index
        rb.update_priority(torch.arange(50), torch.linspace(0.1, 5.0, 50))
        return rb.sample()

    torch.manual_seed(0)
    default = draws()
    torch.manual_seed(0)
    assert torch.equal(draws(), default)
    torch.manual_seed(1)
    own = draws(torch.Generator().manual_seed(7))
    torch.manual_seed(2)  # the global state differs: only the buffer's generator counts
    assert torch.equal(draws(torch.Generator().manual_seed(7)), own)


def test_gym_env_of_reaches_the_gymnasium_env():
    import gymnasium

    from shared.envs import make_env

    env = make_env("Pendulum-v1", render=True)
    try:
        assert isinstance(compat.gym_env_of(env), gymnasium.Env)
    finally:
        env.close()


def test_mujoco_context_is_made_current_before_rendering():
    os.environ.setdefault("MUJOCO_GL", "egl")
    from shared.envs import make_env
    from shared.rendering import render_frame

    env = make_env("Hopper-v5", render=True)
    try:
        env.reset()
        compat.make_mujoco_context_current(compat.gym_env_of(env))
        frame = render_frame(env)
        assert frame.ndim == 3 and frame.shape[-1] == 3 and frame.std() > 0  # a real picture, not a black frame
    finally:
        env.close()


def test_ray_single_machine_mode(monkeypatch):
    pytest.importorskip("ray")
    from ray._private import ray_constants

    monkeypatch.setattr(ray_constants, "ENABLE_RAY_CLUSTER", ray_constants.ENABLE_RAY_CLUSTER)
    monkeypatch.setenv(ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR, "1")
    compat.ray_single_machine_mode()
    assert os.environ[ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR] == "0"
    assert ray_constants.ENABLE_RAY_CLUSTER is False



@pytest.mark.parametrize("algo", ["sac", "td3"])
def test_pseudo_vmap_without_pytree_edits_gives_torchrl_s_losses(algo, monkeypatch):
    """The loss's Q-ensemble loop without tensordict's pytree edits: the same losses as torchrl's own pseudo-vmap,
    and TensorDict stays in torch's pytree registry while the Q networks run (torchrl's takes it out and puts it back
    on every call, which made a compiled step recompile on every call)."""
    from torch.utils._pytree import SUPPORTED_NODES
    from torchrl.objectives import utils

    from offpolicy.builder import Builder
    from offpolicy.config import compose_config
    from offpolicy.envs import make_train_env

    compat.pseudo_vmap_without_pytree_edits()
    compat.pseudo_vmap_without_pytree_edits()  # idempotent
    ours = utils._pseudo_vmap
    assert ours.rlstack_no_pytree_edits
    cfg, _ = compose_config([f"algo={algo}", "env=Pendulum-v1", "profile=smoke"])
    env = make_train_env(cfg)
    batch = env.rollout(40).reshape(-1)
    losses, registered = [], []
    for implementation in (ours.torchrl_original, ours):
        monkeypatch.setattr(utils, "_pseudo_vmap", implementation)
        monkeypatch.setattr(compat, "pseudo_vmap_without_pytree_edits", lambda: None)
        torch.manual_seed(0)
        parts = Builder(cfg).parts(env)
        seen = []
        parts.loss.qvalue_network.register_forward_pre_hook(lambda *_: seen.append(TensorDict in SUPPORTED_NODES))
        torch.manual_seed(1)
        losses.append({k: v.detach() for k, v in parts.loss(batch.clone()).items() if v.numel() == 1})
        registered.append(set(seen))
    # torchrl's takes TensorDict out of the registry around its ensemble's Q-network calls (TD3's actor loss calls
    # its one Q network outside the ensemble loop, so there both are seen); ours never does
    assert False in registered[0] and registered[1] == {True}
    assert losses[0].keys() == losses[1].keys()
    for key in losses[0]:
        assert torch.equal(losses[0][key], losses[1][key]), key


def test_compilations_of_counts_one_function_s_compilations():
    """One per compilation of that function: none for reuse or for another compiled function, one for a new input
    shape (after which the graph takes any size), one for a compilation that a graph break splits in two."""
    def double(x):
        return x * 2 + 1

    def broken(x):
        x = x * 2
        print("a graph break")  # noqa: T201 - the graph break under test
        return x + 1

    compiled_double, compiled_broken = torch.compile(double), torch.compile(broken)
    assert compat.compilations_of(double) == 0
    compiled_double(torch.ones(3))
    compiled_double(torch.ones(3))
    torch.compile(lambda x: x.sin())(torch.ones(3))
    assert compat.compilations_of(double) == 1
    compiled_double(torch.ones(5))
    compiled_double(torch.ones(7))
    assert compat.compilations_of(double) == 2
    compiled_broken(torch.ones(3))
    assert compat.compilations_of(broken) == 1


def test_compile_mode_options_are_the_modes_inductor_options():
    assert compat.compile_mode_options(None) == {}
    assert compat.compile_mode_options("default") == {}
    assert compat.compile_mode_options("max-autotune-no-cudagraphs")["max_autotune"] is True


@pytest.mark.parametrize("prioritized", [False, True])
def test_td3_actor_loss_on_first_q_equals_torchrl_s_with_one_q_network_call(prioritized):
    """The actor loss on the first Q network: the same value and the same actor gradients as torchrl's TD3Loss
    (which evaluates both Q networks and keeps the first), one Q-network call instead of two, no gradient into the
    critics; with priority weights in the batch, weighted as torchrl weights them."""
    from torchrl.objectives import TD3Loss

    from offpolicy.builder import Builder
    from offpolicy.config import compose_config
    from offpolicy.envs import make_train_env

    cfg, _ = compose_config(["algo=td3", "env=Pendulum-v1", "profile=smoke"])
    env = make_train_env(cfg)
    torch.manual_seed(0)
    batch = env.rollout(40).reshape(-1)
    loss = Builder(cfg).parts(env).loss
    if prioritized:
        batch.set(loss.tensor_keys.priority_weight, torch.rand(batch.shape))
    calls = []
    loss.qvalue_network.register_forward_pre_hook(lambda *_: calls.append(1))
    results = []
    for actor_loss in (lambda td: TD3Loss.actor_loss(loss, td), loss.actor_loss):
        calls.clear()
        value, metadata = actor_loss(batch.clone())
        value.backward()
        actor_params = [p for p in loss.actor_network_params.values(True, True) if p.requires_grad]
        grads = [p.grad.clone() for p in actor_params]
        for p in actor_params:
            p.grad = None
        assert all(p.grad is None for p in loss.qvalue_network_params.values(True, True))
        results.append((value.detach(), grads, metadata["state_action_value_actor"], len(calls)))
    (theirs, their_grads, their_q, their_calls), (ours, our_grads, our_q, our_calls) = results
    assert (their_calls, our_calls) == (2, 1)
    assert torch.allclose(ours, theirs, atol=1e-6)
    assert len(our_grads) == len(their_grads) > 0
    for a, b in zip(our_grads, their_grads):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(our_q, their_q[0])
