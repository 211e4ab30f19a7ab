"""The host page backend: the same range/page semantics as CUDA VMM, with counters instead of HBM.

Used on CPU machines and by the simulator, where only the page accounting matters. Ranges are
mapped as a prefix (slots 0..n-1), as the allocator grows a reservation front to back; anything
else is a broken invariant and raises.
"""

from __future__ import annotations

from serving.core.kv.backend import PageBackend


class HostBackend(PageBackend):
    def __init__(self, page_bytes: int, num_physical_pages: int):
        if page_bytes <= 0 or num_physical_pages < 0:
            raise ValueError(
                f"page_bytes must be > 0 and num_physical_pages >= 0, got {page_bytes}, {num_physical_pages}"
            )
        self.page_bytes = page_bytes
        self.num_physical_pages = num_physical_pages
        self._size_pages: dict[int, int] = {}
        self._mapped_pages: dict[int, int] = {}
        self._num_mapped = 0
        self._next_handle = 1

    def reserve_range(self, num_pages: int) -> int | None:
        handle = self._next_handle
        self._next_handle += 1
        self._size_pages[handle] = num_pages
        self._mapped_pages[handle] = 0
        return handle

    def map_pages(self, handle: int, first_page: int, num_pages: int) -> bool:
        mapped = self._mapped_pages[handle]
        if first_page != mapped or first_page + num_pages > self._size_pages[handle]:
            raise RuntimeError(
                f"range {handle}: mapping slots {first_page}+{num_pages} breaks the mapped "
                f"prefix ({mapped} of {self._size_pages[handle]})"
            )
        if self._num_mapped + num_pages > self.num_physical_pages:
            return False
        self._mapped_pages[handle] = mapped + num_pages
        self._num_mapped += num_pages
        return True

    def unmap_pages(self, handle: int, first_page: int, num_pages: int) -> None:
        mapped = self._mapped_pages[handle]
        if first_page + num_pages != mapped or num_pages > mapped:
            raise RuntimeError(
                f"range {handle}: unmapping slots {first_page}+{num_pages} is not the mapped tail (mapped {mapped})"
            )
        self._mapped_pages[handle] = mapped - num_pages
        self._num_mapped -= num_pages

    def free_range(self, handle: int) -> None:
        if self._mapped_pages.pop(handle) != 0:
            raise RuntimeError(f"range {handle} freed while pages are still mapped")
        del self._size_pages[handle]

    @property
    def num_mapped_pages(self) -> int:
        return self._num_mapped
