"""vLLM's automatic prefix caching, as far as a tool loop needs it: freed KV stays reusable until overwritten.

When a session's KV is released (evicted at a tool call, a TTL expiring, idle KV reclaimed), vLLM
(V1, prefix caching on by default) puts its blocks on the free queue *with their hashes*: they count
as free, yet the next turn of the session gets a prefix hit if nobody has overwritten them. Blocks
are reused least-recently-freed first. We keep that at session granularity: a released context is
an LRU entry of `num_pages`; entries are dropped oldest first whenever live allocations have eaten
into them (the cached pages no longer fit in the allocator's free pages). A hit means the next
stage prefills only its new tokens; a miss means re-prefilling the whole context.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixCache:
    def __init__(self, is_enabled: bool = True):
        self.is_enabled = is_enabled
        self._entries: OrderedDict = OrderedDict()  # key -> pages, oldest first
        self.num_pages = 0

    def put(self, key, num_pages: int) -> None:
        if self.is_enabled and num_pages > 0:
            self._entries[key] = num_pages
            self.num_pages += num_pages

    def take(self, key) -> bool:
        """A prefix hit for `key` (its entry is consumed: the new stage's allocation owns those pages)."""
        num_pages = self._entries.pop(key, None)
        if num_pages is None:
            return False
        self.num_pages -= num_pages
        return True

    def trim(self, num_free_pages: int) -> None:
        """Drop the oldest entries until what is cached fits in what the allocator still has free."""
        while self.num_pages > num_free_pages and self._entries:
            self.num_pages -= self._entries.popitem(last=False)[1]

    def __contains__(self, key) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)
