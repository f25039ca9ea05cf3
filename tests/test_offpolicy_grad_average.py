"""The Ray learner ranks' gradient average, over a real two-process Gloo group on this CPU: every rank ends with the
mean (not the sum) of the ranks' gradients, and a parameter without a gradient keeps none."""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from offpolicy.engines.ray import average_gradients


def _rank(rank: int, world_size: int, rendezvous: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    try:
        weight, bias, unused = (torch.nn.Parameter(torch.zeros(shape)) for shape in ((2, 3), (3,), (4,)))
        weight.grad = torch.full((2, 3), float(rank + 1))  # rank 0: 1, rank 1: 2
        bias.grad = torch.arange(3.0) * (rank + 1)
        average_gradients([weight, bias, unused], world_size)
        torch.save({"weight": weight.grad, "bias": bias.grad, "unused": unused.grad}, out)
    finally:
        dist.destroy_process_group()


def _run_two_ranks(target, tmp_path, timeout: float) -> list[str]:
    """``target(rank, 2, rendezvous, out)`` in two spawned processes forming a Gloo group; returns their ``out``
    files."""
    outs = [str(tmp_path / f"rank{r}.pt") for r in range(2)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, 2, str(tmp_path / "rendezvous"), outs[r])) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=timeout)
        assert proc.exitcode == 0
    return outs


def test_two_gloo_ranks_average_their_gradients(tmp_path):
    outs = _run_two_ranks(_rank, tmp_path, timeout=120)
    for out in outs:
        grads = torch.load(out, weights_only=True)
        assert torch.equal(grads["weight"], torch.full((2, 3), 1.5))  # the mean of 1 and 2 (a sum would be 3)
        assert torch.equal(grads["bias"], torch.arange(3.0) * 1.5)
        assert grads["unused"] is None  # no gradient on any rank: none after averaging (it used to become zeros)


def _crossq_step(rank: int, world_size: int, rendezvous: str | None, out: str) -> None:
    """One CrossQ learner step on this rank's own samples (rank r: samples 32r to 32r + 31 of the smoke batch);
    with ``rendezvous``, as a learner rank of a ``world_size`` Gloo group (offpolicy/engines/ray.py's grad_sync)."""
    from offpolicy_helpers import smoke_parts

    from offpolicy.algos.networks import running_statistics
    from offpolicy.engines.ray import rank_sync
    from offpolicy.learner import make_learner

    if rendezvous is not None:
        dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world_size)
    try:
        cfg, env, parts, batch = smoke_parts("crossq", "optim.batch_size=32")
        learner = make_learner(cfg, parts, env.action_spec_unbatched, sample_shape=(32,),
                               grad_sync=rank_sync(parts.loss, world_size) if rendezvous is not None else None)
        learner.step(batch[32 * rank: 32 * (rank + 1)].clone())
        torch.save({"statistics": [b.clone() for b in running_statistics(parts.loss)],
                    "parameters": [p.detach().clone() for p in parts.loss.parameters()]}, out)
    finally:
        if rendezvous is not None:
            dist.destroy_process_group()


def test_learner_ranks_average_crossq_s_running_statistics(tmp_path):
    """Each rank's forward moves CrossQ's batch-renormalisation statistics with its own samples: after a step of two
    Gloo ranks both hold the mean of what each rank alone would hold (and the same parameters), not their own."""
    outs = _run_two_ranks(_crossq_step, tmp_path, timeout=180)
    alone = []
    for r in range(2):
        _crossq_step(r, 1, None, str(tmp_path / f"alone{r}.pt"))
        alone.append(torch.load(tmp_path / f"alone{r}.pt", weights_only=True)["statistics"])
    ranks = [torch.load(out, weights_only=True) for out in outs]
    assert len(alone[0]) == 6  # running mean and variance of the input and of both hidden layers
    # the ranks' own samples move them apart (the input's statistics at least: a layer right after a batch-normalised
    # one sees the same batch mean, its bias, on every rank)
    assert sum(not torch.allclose(mine, other) for mine, other in zip(*alone)) >= 2
    for i, (mine, other) in enumerate(zip(*alone)):
        for rank in ranks:
            torch.testing.assert_close(rank["statistics"][i], (mine + other) / 2)
    assert all(torch.equal(a, b) for a, b in zip(ranks[0]["parameters"], ranks[1]["parameters"]))
