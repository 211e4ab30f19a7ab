"""A node's KV budget, counted in vLLM blocks: the gateway's reservations, vLLM's measured use, the held contexts.

A host-backend `KVAllocator` whose page is one block (`block_size` tokens, one "byte" per token) holds the gateway's
reservations, within `overcommit` × vLLM's blocks; `/metrics` gives vLLM's own view (`vllm:kv_cache_usage_perc`,
`num_gpu_blocks` from `vllm:cache_config_info`, vllm_sync.py). Free blocks = total − max(reserved by the gateway, used
according to vLLM), so traffic that bypasses the gateway still counts.
"""

from __future__ import annotations

import math

from serving.core.kv import KVAllocator, KVAllocatorConfig, Reservation


class KVBudget:
    """One node's blocks (see the module docstring); no pool until vLLM's block count is known (`size`)."""

    def __init__(self, overcommit: float = 1.0):
        self.overcommit = overcommit
        self.allocator: KVAllocator | None = None
        self.block_size = 16
        self.num_vllm_blocks = 0
        self.kv_usage = 0.0  # vLLM's share of blocks in use: its last /metrics, less what finished since
        self.held: dict[str, int] = {}  # session → blocks held for it during a tool call (`hold`)

    @property
    def num_blocks(self) -> int:
        return self.num_vllm_blocks if self.allocator else 0

    @property
    def num_free_blocks(self) -> int:
        """Blocks a new stage may reserve: room in the (overcommitted) reservation budget and in vLLM right now."""
        return min(self.num_unreserved_blocks, self.num_unused_blocks) if self.allocator else 0

    @property
    def num_unreserved_blocks(self) -> int:
        return self.allocator.num_physical_pages - self.allocator.backend.num_mapped_pages if self.allocator else 0

    @property
    def num_unused_blocks(self) -> int:
        """Free according to vLLM's last /metrics (less what finished since), less the blocks held for sessions."""
        return self.num_blocks - math.ceil(self.kv_usage * self.num_blocks) - sum(self.held.values())

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_ever_fit(self, num_tokens: int) -> bool:
        return self.allocator is not None and self.blocks_for(num_tokens) <= self.num_blocks

    def size(self, num_blocks: int, block_size: int) -> None:
        """vLLM's block count and size: the pool is (re)made for them, unless reservations are live in it."""
        if self.allocator is not None and self.num_blocks == num_blocks and self.block_size == block_size:
            return
        if self.allocator is not None and self.allocator.backend.num_mapped_pages:
            return  # keep the live pool while reservations exist; a restart shows up with none
        # Reservations are for a stage's peak (prompt + whole output), which vLLM reaches only at its last token:
        # a budget of overcommit × blocks lets more stages run while vLLM's measured use still caps admission.
        self.block_size, self.num_vllm_blocks = block_size, num_blocks
        num_budget_blocks = int(num_blocks * self.overcommit)
        self.allocator = KVAllocator(
            KVAllocatorConfig(pool_bytes=num_budget_blocks * block_size, page_bytes=block_size, overcommit=1.0)
        )

    def observe_usage(self, kv_usage: float) -> None:
        """vLLM's `kv_cache_usage_perc` from a /metrics answer."""
        self.kv_usage = kv_usage

    def reserve(self, num_tokens: int) -> Reservation | None:
        """Map `num_tokens` of the budget; None when they do not fit."""
        return self.allocator.reserve(num_tokens, num_tokens, 1) if self.allocator is not None else None

    def release(self, reservation: Reservation) -> None:
        num_blocks = reservation.mapped_pages
        self.allocator.release(reservation)
        # vLLM frees a finished request's blocks at once; its last /metrics (up to metrics_period_s old) still
        # counts them, and would hold the next stage back until the next poll. Take them off until then.
        self.kv_usage = max(0.0, self.kv_usage - num_blocks / max(1, self.num_blocks))

    def hold(self, key: str, num_tokens: int) -> bool:
        """Count a session's context as used while its tool runs (gateway/sessions.py), so that no stage is admitted
        into it and vLLM's prefix cache keeps it; False (nothing held) where it does not fit in the free blocks."""
        num_blocks = self.blocks_for(num_tokens)
        if self.allocator is None or num_blocks > self.num_unused_blocks:
            return False
        self.held[key] = num_blocks
        return True

    def unhold(self, key: str) -> None:
        self.held.pop(key, None)
