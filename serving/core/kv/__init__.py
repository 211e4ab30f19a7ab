"""Page-granular KV memory: virtual reservations, physical pages mapped on demand (DESIGN §5)."""

from serving.core.kv.allocator import KVAllocator, KVAllocatorConfig, Reservation
from serving.core.kv.backend import BackendKind, PageBackend, create_backend

__all__ = ["BackendKind", "KVAllocator", "KVAllocatorConfig", "PageBackend", "Reservation", "create_backend"]
