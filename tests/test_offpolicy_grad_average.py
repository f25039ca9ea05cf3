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


def test_two_gloo_ranks_average_their_gradients(tmp_path):
    outs = [str(tmp_path / f"rank{r}.pt") for r in range(2)]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank, args=(r, 2, str(tmp_path / "rendezvous"), outs[r])) for r in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(timeout=120)
        assert proc.exitcode == 0
    for out in outs:
        grads = torch.load(out, weights_only=True)
        assert torch.equal(grads["weight"], torch.full((2, 3), 1.5))  # the mean of 1 and 2 (a sum would be 3)
        assert torch.equal(grads["bias"], torch.arange(3.0) * 1.5)
        assert grads["unused"] is None  # no gradient on any rank: none after averaging (it used to become zeros)
