"""Sharding `codila eval` over processes with torch.distributed (``torchrun --nproc-per-node N``).

Each rank evaluates tasks ``rank, rank + N, …`` of every setting; rank 0 gathers the rows (gloo on CPU,
nccl on GPUs, one device per local rank), restores the unsharded order and writes the outputs. Greedy
decoding with a fixed seed makes sharded and unsharded runs give the same rows.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_from_env() -> Shard:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Shard()
    import torch
    import torch.distributed as dist

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if backend == "nccl":
        torch.cuda.set_device(local)
    return Shard(dist.get_rank(), dist.get_world_size(), local)


def device_for(shard: Shard, requested: str) -> str:
    if shard.world > 1 and requested in ("auto", "cuda"):
        import torch

        if torch.cuda.is_available():
            return f"cuda:{shard.local_rank}"
    return requested


def gather_rows(shard: Shard, rows: list[dict]) -> list[dict] | None:
    """All rows on rank 0 (None elsewhere), in (setting, task) order of the unsharded run."""
    if shard.world == 1:
        return rows
    import torch.distributed as dist

    parts: list = [None] * shard.world if shard.main else None  # type: ignore[assignment]
    dist.gather_object(rows, parts, dst=0)
    dist.barrier()
    if not shard.main:
        return None
    merged = [r for part in parts for r in part]
    return sorted(merged, key=lambda r: (r["_setting_index"], r["_task_index"]))


def finish() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
