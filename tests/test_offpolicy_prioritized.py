"""The pure-torch prioritized sampler inside a real torchrl TensorDictReplayBuffer: uniform before any update,
P(i) = p_i^alpha / sum after, importance weights (p_i / p_min)^(-alpha*beta) under "priority_weight", applied by a
torchrl loss, priorities kept by state_dict and correct after the FIFO wraps around, and indices drawn from torch's RNG
(the same seed samples the same indices; a checkpoint continues the stream)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tensordict import TensorDict
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer

from offpolicy.replay.prioritized import TorchPrioritizedSampler

N, B, ALPHA, BETA = 100, 5000, 0.7, 0.5
HOT = torch.tensor([3, 17, 42])


def _data(n: int, start: int = 0) -> TensorDict:
    """``n`` CartPole-shaped transitions; observation[:, 0] is the write count, to tell old from new items."""
    obs = torch.randn(n, 4)
    obs[:, 0] = torch.arange(start, start + n, dtype=torch.float)
    action = torch.nn.functional.one_hot(torch.randint(2, (n,)), 2)
    done = torch.zeros(n, 1, dtype=torch.bool)
    return TensorDict({"observation": obs, "action": action,
                       "next": {"observation": torch.randn(n, 4), "reward": torch.randn(n, 1), "done": done,
                                "terminated": done.clone()}}, [n])


def _empty_buffer() -> TensorDictReplayBuffer:
    sampler = TorchPrioritizedSampler(N, alpha=ALPHA, beta=BETA)
    return TensorDictReplayBuffer(storage=LazyTensorStorage(N), sampler=sampler, batch_size=B)


def _buffer(n_items: int = N) -> TensorDictReplayBuffer:
    torch.manual_seed(0)
    rb = _empty_buffer()
    rb.extend(_data(n_items))
    return rb


def _counts(rb: TensorDictReplayBuffer, calls: int = 20) -> torch.Tensor:
    idx = torch.cat([rb.sample()["index"] for _ in range(calls)])
    return torch.bincount(idx, minlength=N).double() / idx.numel()


def _heat(rb: TensorDictReplayBuffer, td_error: float = 10.0) -> None:
    """Give the HOT items a large TD error the way a training loop does: a tensordict with "index" and "td_error"."""
    rb.update_tensordict_priority(TensorDict({"index": HOT, "td_error": torch.full((3,), td_error)}, [3]))


def _expected_p(n: int = N, hot=HOT, td_error: float = 10.0) -> torch.Tensor:
    p = torch.ones(n, dtype=torch.double)  # new items got the initial max priority 1 -> (1 + eps)^alpha ~ 1
    p[hot] = (td_error + 1e-8) ** ALPHA
    return p / p.sum()


def test_is_a_torchrl_prioritized_sampler_and_uniform_before_updates():
    from torchrl.data import PrioritizedSampler

    rb = _buffer()
    assert isinstance(rb.sampler, PrioritizedSampler)
    freq = _counts(rb)
    assert (freq - 1 / N).abs().max() < 0.25 / N  # 100k draws: ~3% std per item
    assert torch.equal(rb.sample()["priority_weight"], torch.ones(B))


def test_high_td_error_items_are_sampled_in_proportion_to_p_alpha():
    rb = _buffer()
    _heat(rb)
    freq, expected = _counts(rb), _expected_p()
    assert expected[HOT].sum() > 0.12  # ~0.134 vs 0.03 uniform: the check below can tell the two apart
    assert torch.allclose(freq[HOT], expected[HOT], rtol=0.1)
    assert freq[HOT].sum() == pytest.approx(expected[HOT].sum().item(), rel=0.05)
    cold = torch.ones(N, dtype=torch.bool)
    cold[HOT] = False
    assert (freq[cold] - expected[cold]).abs().max() < 0.3 * expected[cold][0]
    assert rb.sampler.default_priority == pytest.approx(10.0)  # new items now enter at the max priority


def test_sample_carries_importance_weights_of_the_formula():
    rb = _buffer()
    _heat(rb)
    sample = rb.sample()
    idx, w = sample["index"], sample["priority_weight"]
    p_alpha = torch.ones(N)
    p_alpha[HOT] = 10.0 ** ALPHA
    assert torch.allclose(w, (p_alpha[idx] / p_alpha.min()) ** -BETA)
    is_hot = torch.isin(idx, HOT)
    assert is_hot.any() and (~is_hot).any()
    assert torch.all(w[~is_hot] == 1.0)
    assert torch.allclose(w[is_hot], torch.tensor(10.0 ** (-ALPHA * BETA)))  # ~0.447
    assert sample.get("priority_weight").shape == (B,) and "index" in sample


def test_dqn_loss_applies_the_weights_and_its_td_error_feeds_back():
    from torchrl.data import OneHot
    from torchrl.modules import MLP, QValueActor
    from torchrl.objectives import DQNLoss

    rb = _buffer()
    _heat(rb)
    spec = OneHot(2)
    qnet = QValueActor(MLP(in_features=4, out_features=2, num_cells=[8]), in_keys=["observation"], spec=spec)
    loss_mean = DQNLoss(qnet, action_space=spec, delay_value=False, loss_function="l2")
    loss_none = DQNLoss(qnet, action_space=spec, delay_value=False, loss_function="l2", reduction="none")
    sample = rb.sample()
    w = sample["priority_weight"]
    assert torch.equal(loss_mean._maybe_get_priority_weight(sample), w)
    per_item = loss_none(sample.exclude("priority_weight"))["loss"]
    weighted = loss_mean(sample)["loss"]
    unweighted = loss_mean(sample.exclude("priority_weight"))["loss"]
    assert torch.allclose(weighted, (per_item * w).sum() / w.sum())
    assert not torch.allclose(weighted, unweighted)
    # the engine's learner turns the loss's TD error into |delta| and the sampler into (|delta| + eps)^alpha; delta
    # by hand: r + gamma * max_a' Q(s', a') - Q(s, a) (no target network here, nothing terminal)
    from offpolicy.learner import abs_td_error

    with torch.no_grad():
        q = qnet.module[0](sample["observation"])
        q_sa = (q * sample["action"]).sum(-1)
        target = sample["next", "reward"].squeeze(-1) + loss_mean.value_estimator.gamma * \
            qnet.module[0](sample["next", "observation"]).max(-1).values
    delta = (target - q_sa).abs()
    sample.set("td_error", abs_td_error(sample["td_error"], squared=True))  # as the learner does: DQNLoss wrote delta^2
    rb.update_tensordict_priority(sample)
    sum_tree, _ = rb.sampler.trees()
    assert torch.allclose(sum_tree.values[sample["index"]], (delta.double() + 1e-8) ** ALPHA, rtol=1e-4)


def test_state_dict_round_trip_keeps_priorities(tmp_path):
    from shared.checkpoint import load_checkpoint, save_checkpoint

    rb = _buffer()
    _heat(rb)
    save_checkpoint(tmp_path / "ckpt.pt", {"replay": rb.state_dict()})
    fresh = _empty_buffer()
    fresh.load_state_dict(load_checkpoint(tmp_path / "ckpt.pt")["replay"])
    assert torch.equal(fresh.sampler._sum_tree.values.float(), rb.sampler._sum_tree.values.float())
    assert fresh.sampler.default_priority == pytest.approx(10.0)
    assert torch.allclose(_counts(fresh)[HOT], _expected_p()[HOT], rtol=0.1)
    fresh.extend(_data(1, start=N))  # slot 0, overwritten: enters at the restored max priority
    assert fresh.sampler._sum_tree.values.float()[0] == pytest.approx(10.0 ** ALPHA)


def test_after_wrap_around_new_items_take_the_max_priority():
    rb = _buffer()
    _heat(rb)
    rb.extend(_data(30, start=N))  # overwrites slots 0..29 (FIFO), each at the max priority 10
    assert len(rb) == N
    hot = torch.cat([torch.arange(30), HOT[HOT >= 30]])
    freq, expected = _counts(rb), _expected_p(hot=hot)
    assert torch.allclose(freq[hot], expected[hot], rtol=0.15)
    assert freq[hot].sum() == pytest.approx(expected[hot].sum().item(), rel=0.05)
    sample = rb.sample()
    new = sample["index"] < 30
    assert torch.equal(sample["observation"][new, 0], sample["index"][new].float() + N)  # the new data, not the old


def test_sampling_only_covers_the_filled_part():
    rb = _buffer(n_items=10)
    _heat(rb)  # slots 17 and 42 are empty: their priority must not make them sampleable
    idx = rb.sample()["index"]
    assert idx.max() < 10 and len(rb) == 10


def test_segment_tree_matches_brute_force():
    from offpolicy.replay.prioritized import TorchSegmentTree

    torch.manual_seed(0)
    cap = 1000  # not a power of two: padding leaves must stay neutral
    sums, mins = TorchSegmentTree(cap, "sum"), TorchSegmentTree(cap, "min")
    values = torch.rand(cap, dtype=torch.float64)
    sums[torch.arange(cap).numpy()] = values
    mins[torch.arange(cap).numpy()] = values
    for _ in range(5):
        # priorities coming back for a batch sampled with replacement: slots repeat, and a repeated slot (the same
        # transition) comes back with the same priority each time
        idx = torch.randint(cap, (600,))
        assert idx.unique().numel() < 550
        priority = torch.rand(cap, dtype=torch.float64) * 5
        priority[::7] = 0.0  # zero-priority slots
        sums[idx.numpy()] = priority[idx]
        mins[idx.numpy()] = priority[idx]
        values[idx] = priority[idx]
    assert torch.allclose(sums.values, values)
    for left, right in [(0, cap), (0, 1), (13, 977), (500, 501), (999, 1000)]:
        assert sums.query(left, right) == pytest.approx(float(values[left:right].sum()))
        assert mins.query(left, right) == pytest.approx(float(values[left:right].min()))
    mass = torch.rand(2000, dtype=torch.float64) * values.sum()
    expected = torch.searchsorted(values.cumsum(0), mass, right=True).clamp_max(cap - 1)
    assert torch.equal(torch.as_tensor(sums.scan_lower_bound(mass)), expected)
    assert (values[torch.as_tensor(sums.scan_lower_bound(mass))] > 0).all()  # zero slots are never drawn
    rebuilt = TorchSegmentTree(cap, "sum")
    rebuilt.set_all(values)
    assert torch.allclose(rebuilt.nodes, sums.nodes)
    # one write giving a slot two different values: the slot keeps one of them and every inner node follows the leaves
    sums[np.array([5, 700, 5])] = torch.tensor([1.0, 3.0, 2.0], dtype=torch.float64)
    assert float(sums.values[5]) in (1.0, 2.0) and float(sums.values[700]) == 3.0
    rebuilt.set_all(sums.values)
    assert torch.allclose(rebuilt.nodes, sums.nodes)
    assert sums.query(0, cap) == pytest.approx(float(sums.values.sum()))


def _draws(rb: TensorDictReplayBuffer, calls: int = 3) -> torch.Tensor:
    return torch.cat([rb.sample()["index"] for _ in range(calls)])


def test_the_same_torch_seed_samples_the_same_indices():
    """Sampling draws from torch's RNG, which a run seeds with torch.manual_seed (torchrl's sampler drew from numpy's
    global RNG, which nothing seeds: the same seed gave other batches)."""
    first, second = _buffer(), _buffer()
    _heat(first)
    _heat(second)
    torch.manual_seed(1)
    drawn = _draws(first)
    torch.manual_seed(1)
    assert torch.equal(_draws(second), drawn)
    assert not torch.equal(_draws(second), drawn)  # and the stream moves on


def test_a_checkpoint_round_trip_continues_the_same_index_stream(tmp_path):
    """A run checkpoints the replay's state_dict and torch.get_rng_state(): restored into a fresh buffer (in a process
    whose RNG is elsewhere), sampling goes on exactly as the uninterrupted run."""
    from shared.checkpoint import load_checkpoint, save_checkpoint

    rb = _buffer()
    _heat(rb)
    rb.sample()
    save_checkpoint(tmp_path / "ckpt.pt", {"replay": rb.state_dict(), "rng": torch.get_rng_state()})
    uninterrupted = _draws(rb)
    fresh = _empty_buffer()
    checkpoint = load_checkpoint(tmp_path / "ckpt.pt")
    fresh.load_state_dict(checkpoint["replay"])
    torch.manual_seed(123)
    torch.set_rng_state(checkpoint["rng"])
    assert torch.equal(_draws(fresh), uninterrupted)
