"""Data parallelism for the embedded trainer: N processes, one model copy each, one update.

Every rank samples its share of a step's prompts (whole groups: a group's advantages never
cross ranks), then the ranks exchange what the harness reads (`gather`): each runs the
harness's reward, filter and advantage on the whole batch, so every rank holds the same
signal a single process would compute, and rank 0 writes the batch's evidence. The loss of a
rank's rows is weighted by the aggregation's weights over the whole batch (accumulate.py: a
built-in aggregation is linear in the per-token loss), so the gradients the ranks sum
(`sum_gradients`, an all-reduce) are the whole batch's gradient, and every rank's AdamW takes
the same step: no rank is the "main" copy. This is DDP's arithmetic written out (torch's
DistributedDataParallel averages gradients, which is the batch mean only when every rank's
loss has the same denominator; a token mean over rows of different lengths has not).

Processes talk over torch.distributed: gloo on a CPU, NCCL on CUDA.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class World:
    """This process's rank among `size` training processes (size 1: no torch.distributed)."""
    rank: int = 0
    size: int = 1

    @property
    def parallel(self) -> bool:
        return self.size > 1

    def shard(self, n: int) -> slice:
        """The rank's share of `n` items (prompts of a step): contiguous, the first ranks one more."""
        per, extra = divmod(n, self.size)
        start = self.rank * per + min(self.rank, extra)
        return slice(start, start + per + (self.rank < extra))

    def gather(self, obj) -> list:
        """Every rank's `obj`, in rank order, on every rank (a list of one without parallelism)."""
        if not self.parallel:
            return [obj]
        out = [None] * self.size
        dist.all_gather_object(out, obj)
        return out

    def same_start(self, params) -> None:
        """Every rank's parameters set to rank 0's (as DDP does when it wraps a model): a new
        LoRA adapter's random init must not depend on each process's random state."""
        if not self.parallel:
            return
        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, src=0)

    def sum_gradients(self, params) -> None:
        """Each parameter's gradient summed over the ranks, in place (one flat all-reduce)."""
        if not self.parallel:
            return
        grads = [p.grad for p in params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        at = 0
        for g in grads:
            g.copy_(flat[at:at + g.numel()].view_as(g))
            at += g.numel()


def join(rank: int, size: int, rendezvous: str, backend: str = "gloo") -> World:
    """Join the process group of `size` ranks that meets at file `rendezvous` (a path every rank sees)."""
    if size > 1:
        dist.init_process_group(backend, init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    return World(rank, size)


def leave(world: World) -> None:
    if world.parallel and dist.is_initialized():
        dist.destroy_process_group()
