"""Which vLLM engine a torchrun rank samples with, and which prompts that engine takes.

Under ``torchrun`` with ``backend=vllm`` every rank builds an in-process engine (vLLM's
``distributed_executor_backend="external_launcher"``, the pattern of TRL's colocate mode).
``tensor_parallel_size`` consecutive ranks form one engine group and share one engine (each rank
holds its shard of it); with ``tensor_parallel_size`` 1 every rank is its own group. vLLM lays its
process groups out as ExternalDP x DP x PP x TP over the torch world, so with its own
``data_parallel_size`` left at 1 the groups are independent ("external" data parallelism): each
engine schedules and steps on its own, and no generate call waits for another group's. (vLLM's
``data_parallel_size`` > 1 would make the groups step in lock-step, every rank's ``generate``
a collective, ``vllm/distributed/parallel_state.py::initialize_model_parallel`` in 0.32.)

The groups split the prompts of each generate call (contiguous shares, the first ones longer),
and the completions are all-gathered back in prompt order, so every rank holds the whole call.
Per-request seeds use a prompt's index in the whole call, so the samples do not depend on the
world size. Every rank of the job must make the same generate calls (a collective).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch.distributed as dist

from rredcot_cli.errors import RredcotError


@dataclass(frozen=True)
class EngineGroups:
    """This rank's place among the engines: ``rank`` of ``world_size`` ranks, groups of
    ``tensor_parallel_size``. The default is one process, one engine."""

    rank: int = 0
    world_size: int = 1
    tensor_parallel_size: int = 1
    _group: Any = field(default=None, compare=False, repr=False)  # gloo: completions travel on the CPU

    def __post_init__(self) -> None:
        if self.tensor_parallel_size < 1 or self.world_size % self.tensor_parallel_size:
            raise RredcotError(f"backend.tensor_parallel_size={self.tensor_parallel_size} must divide the "
                               f"{self.world_size} torchrun ranks (one vLLM engine per group of that many ranks)")

    @classmethod
    def of_this_process(cls, tensor_parallel_size: int) -> "EngineGroups":
        """From the initialised torch.distributed world (the train stage starts it before the
        policy loads); one process otherwise."""
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return cls(tensor_parallel_size=tensor_parallel_size)
        # Every rank builds its policy at the same point, so they all create this group together.
        group = dist.new_group(backend="gloo") if dist.get_backend() != "gloo" else None
        return cls(dist.get_rank(), dist.get_world_size(), tensor_parallel_size, group)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def group(self) -> int:
        """This rank's engine group (the ranks ``group * tp .. group * tp + tp - 1``)."""
        return self.rank // self.tensor_parallel_size

    @property
    def groups(self) -> int:
        return self.world_size // self.tensor_parallel_size

    def engine_seed(self, seed: int) -> int:
        """The engine's seed: one per group, the same on the ranks of a group (their samplers must
        agree), ``seed`` itself in one process. Requests carry seeds of their own
        (``vllm.request_seed``); this one only seeds what a request leaves unseeded."""
        return seed + self.group

    def share(self, count: int) -> range:
        """The indices of this group's contiguous share of ``count`` prompts."""
        base, extra = divmod(count, self.groups)
        start = self.group * base + min(self.group, extra)
        return range(start, start + base + (self.group < extra))

    def gather(self, mine: list) -> list:
        """The groups' shares concatenated in group order (the first rank of each group
        contributes; the ranks of a group computed the same thing). Collective."""
        if not self.distributed:
            return list(mine)
        parts: list[Any] = [None] * self.world_size
        dist.all_gather_object(parts, mine, group=self._group)
        return [x for part in parts[:: self.tensor_parallel_size] for x in part]
