"""Page backends: where KV pages physically live. One interface, a host and a CUDA VMM implementation.

A backend hands out *virtual ranges* (a contiguous run of page slots, like `cuMemAddressReserve`)
and maps physical pages into a range's prefix on demand (like `cuMemCreate` + `cuMemMap`). It
knows nothing about tokens, stages or policies; the allocator above it does that accounting.
"""

from __future__ import annotations

import enum
from abc import ABC, abstractmethod


class BackendKind(enum.Enum):
    HOST = "host"
    CUDA_VMM = "cuda-vmm"


class PageBackend(ABC):
    """Virtual ranges whose page slots are backed by physical pages only once mapped."""

    page_bytes: int
    num_physical_pages: int

    @abstractmethod
    def reserve_range(self, num_pages: int) -> int | None:
        """Reserve a virtual range of `num_pages` slots; returns a handle, or None if address space ran out."""

    @abstractmethod
    def map_pages(self, handle: int, first_page: int, num_pages: int) -> bool:
        """Back slots [first_page, first_page + num_pages) with physical pages; False if that failed."""

    @abstractmethod
    def unmap_pages(self, handle: int, first_page: int, num_pages: int) -> None:
        """Give the physical pages of those slots back; the virtual range stays reserved."""

    @abstractmethod
    def free_range(self, handle: int) -> None:
        """Drop a virtual range; its pages must already be unmapped."""

    @property
    @abstractmethod
    def num_mapped_pages(self) -> int:
        """Physical pages currently mapped, over all ranges."""


def create_backend(kind: str | BackendKind, page_bytes: int, num_physical_pages: int, device: int = 0) -> PageBackend:
    """Build a page backend by name ("host" or "cuda-vmm")."""
    try:
        kind = BackendKind(kind)
    except ValueError:
        known = ", ".join(k.value for k in BackendKind)
        raise ValueError(f"unknown KV backend '{kind}'; known backends: {known}") from None
    if kind is BackendKind.HOST:
        from serving.core.kv.host import HostBackend

        return HostBackend(page_bytes, num_physical_pages)
    from serving.core.kv.cuda_vmm import CudaVMMBackend

    return CudaVMMBackend(page_bytes, num_physical_pages, device)
