"""The KV allocator: virtual reservations sized for the worst case, physical pages mapped on demand.

A stage gets a virtual range big enough for prompt + max_tokens (virtual space is overcommitted
up to `overcommit` × physical; `math.inf`: no limit, as vLLM's paging), and physical pages only
for prompt + the predictor's `tokens_reserve`. Decode grows the mapping page by page; the end of the stage releases it.
"Does not fit" is a return value (`reserve` → None, `grow` → False); a broken invariant raises.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from serving.core.kv.backend import PageBackend, create_backend


@dataclass
class KVAllocatorConfig:
    """Size of one node's KV pool and how far its virtual space may be overcommitted."""

    pool_bytes: int
    page_bytes: int = 2 * 1024 * 1024  # CUDA VMM's usual allocation granularity
    overcommit: float = 3.0  # virtual pages may reach this × physical pages (the seed's 122 GB on 40 GB)
    backend: str = "host"
    device: int = 0

    def __post_init__(self):
        if self.page_bytes <= 0 or self.pool_bytes < self.page_bytes:
            raise ValueError(f"pool_bytes ({self.pool_bytes}) must hold at least one page of {self.page_bytes} bytes")
        if self.overcommit < 1.0:
            raise ValueError(f"overcommit must be >= 1.0 (virtual space at least physical), got {self.overcommit}")

    @property
    def num_physical_pages(self) -> int:
        return self.pool_bytes // self.page_bytes


@dataclass(eq=False)
class Reservation:
    """An opaque handle on one stage's KV: the scheduler sees sizes, never page tables."""

    handle: int
    bytes_per_token: int
    virtual_pages: int
    mapped_pages: int = 0

    def capacity_tokens(self, page_bytes: int) -> int:
        return self.mapped_pages * page_bytes // self.bytes_per_token


class KVAllocator:
    def __init__(self, config: KVAllocatorConfig, backend: PageBackend | None = None):
        self.config = config
        self.backend = backend or create_backend(
            config.backend, config.page_bytes, config.num_physical_pages, config.device
        )
        self.page_bytes = self.backend.page_bytes
        self.num_physical_pages = self.backend.num_physical_pages
        limit = self.num_physical_pages * config.overcommit
        self.num_virtual_pages_limit = limit if math.isinf(limit) else int(limit)
        self.num_virtual_pages = 0

    @property
    def num_free_pages(self) -> int:
        return self.num_physical_pages - self.backend.num_mapped_pages

    @property
    def usage(self) -> float:
        return self.backend.num_mapped_pages / max(1, self.num_physical_pages)

    def pages_for(self, num_tokens: int, bytes_per_token: int) -> int:
        return -(-max(0, num_tokens) * bytes_per_token // self.page_bytes)

    def can_fit(self, reserve_tokens: int, bytes_per_token: int) -> bool:
        """Admission's test: are there free physical pages for this reserve right now?"""
        return self.pages_for(reserve_tokens, bytes_per_token) <= self.num_free_pages

    def reserve(self, reserve_tokens: int, max_tokens: int, bytes_per_token: int) -> Reservation | None:
        """Reserve virtual space for `max_tokens` and map pages for `reserve_tokens`; None if either won't fit."""
        if reserve_tokens > max_tokens:
            raise ValueError(f"reserve_tokens ({reserve_tokens}) exceeds max_tokens ({max_tokens})")
        virtual = self.pages_for(max_tokens, bytes_per_token)
        mapped = self.pages_for(reserve_tokens, bytes_per_token)
        if self.num_virtual_pages + virtual > self.num_virtual_pages_limit or mapped > self.num_free_pages:
            return None
        handle = self.backend.reserve_range(virtual)
        if handle is None:
            return None
        reservation = Reservation(handle, bytes_per_token, virtual)
        self.num_virtual_pages += virtual
        if not self._map(reservation, mapped):
            self.release(reservation)
            return None
        return reservation

    def grow(self, reservation: Reservation, total_tokens: int) -> bool:
        """Map pages until `total_tokens` fit; False (nothing changed) if the pool or the range is exhausted."""
        needed = self.pages_for(total_tokens, reservation.bytes_per_token)
        extra = needed - reservation.mapped_pages
        if extra <= 0:
            return True
        if needed > reservation.virtual_pages or extra > self.num_free_pages:
            return False
        return self._map(reservation, extra)

    def shrink(self, reservation: Reservation, total_tokens: int) -> None:
        """Unmap pages beyond what `total_tokens` needs (e.g. an over-reserve once a stage is done)."""
        keep = self.pages_for(total_tokens, reservation.bytes_per_token)
        surplus = reservation.mapped_pages - keep
        if surplus > 0:
            self.backend.unmap_pages(reservation.handle, keep, surplus)
            reservation.mapped_pages = keep

    def release(self, reservation: Reservation) -> None:
        if reservation.virtual_pages < 0:
            raise RuntimeError("reservation released twice")
        self.shrink(reservation, 0)
        self.backend.free_range(reservation.handle)
        self.num_virtual_pages -= reservation.virtual_pages
        reservation.virtual_pages = -1

    def _map(self, reservation: Reservation, num_pages: int) -> bool:
        if num_pages == 0:
            return True
        if not self.backend.map_pages(reservation.handle, reservation.mapped_pages, num_pages):
            return False
        reservation.mapped_pages += num_pages
        return True
