"""KV allocator: exact fit, overcommit, map failure, growth, and invariants under random operations."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from serving.core.kv import KVAllocator, KVAllocatorConfig, create_backend
from serving.core.kv.host import HostBackend

PAGE = 1024


def allocator(num_pages=10, overcommit=3.0) -> KVAllocator:
    return KVAllocator(KVAllocatorConfig(pool_bytes=num_pages * PAGE, page_bytes=PAGE, overcommit=overcommit))


def test_exact_fit_is_admitted_one_more_page_is_not():
    kv = allocator(10)
    assert kv.reserve(10 * 16, 10 * 16, bytes_per_token=64) is not None  # 16 tokens per page
    assert kv.num_free_pages == 0
    assert kv.reserve(1, 1, bytes_per_token=64) is None


def test_virtual_overcommit_limits_reservations_not_physical_pages():
    kv = allocator(10, overcommit=2.0)
    first = kv.reserve(16, 16 * 15, 64)  # 15 virtual pages, 1 mapped
    assert first is not None and first.mapped_pages == 1
    assert kv.reserve(16, 16 * 6, 64) is None  # 15 + 6 > 20 virtual pages
    assert kv.reserve(16, 16 * 5, 64) is not None


def test_grow_maps_pages_and_fails_without_changing_anything():
    kv = allocator(4)
    a = kv.reserve(16, 64, 64)
    b = kv.reserve(32, 64, 64)
    assert kv.grow(a, 32) and a.mapped_pages == 2
    assert not kv.grow(a, 64)  # needs 2 more, 0 free
    assert a.mapped_pages == 2 and kv.num_free_pages == 0
    kv.release(b)
    assert kv.grow(a, 64) and kv.num_free_pages == 0


def test_grow_beyond_virtual_range_fails():
    kv = allocator(10)
    a = kv.reserve(16, 32, 64)
    assert not kv.grow(a, 48)


def test_map_failure_in_backend_is_a_return_value():
    class FailingBackend(HostBackend):
        def map_pages(self, handle, first_page, num_pages):
            return False

    kv = KVAllocator(KVAllocatorConfig(pool_bytes=10 * PAGE, page_bytes=PAGE), FailingBackend(PAGE, 10))
    assert kv.reserve(16, 64, 64) is None
    assert kv.num_virtual_pages == 0  # the virtual range was given back


def test_double_release_raises():
    kv = allocator()
    a = kv.reserve(16, 16, 64)
    kv.release(a)
    with pytest.raises(RuntimeError):
        kv.release(a)


def test_config_and_factory_validate():
    with pytest.raises(ValueError):
        KVAllocatorConfig(pool_bytes=10, page_bytes=1024)
    with pytest.raises(ValueError):
        KVAllocatorConfig(pool_bytes=4096, page_bytes=1024, overcommit=0.5)
    with pytest.raises(ValueError, match="known backends"):
        create_backend("tpu", 1024, 4)


ops = st.lists(
    st.tuples(st.sampled_from(["reserve", "grow", "shrink", "release"]), st.integers(0, 20), st.integers(1, 400)),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(ops)
def test_pages_are_conserved_under_any_sequence(operations):
    kv = allocator(16, overcommit=2.0)
    live = []
    for op, pick, tokens in operations:
        if op == "reserve":
            r = kv.reserve(min(tokens, 200), 200, 64)
            if r is not None:
                live.append(r)
        elif live:
            r = live[pick % len(live)]
            if op == "grow":
                kv.grow(r, tokens)
            elif op == "shrink":
                kv.shrink(r, tokens)
            else:
                kv.release(live.pop(pick % len(live)))
        mapped = sum(r.mapped_pages for r in live)
        assert mapped == kv.backend.num_mapped_pages == kv.num_physical_pages - kv.num_free_pages
        assert 0 <= mapped <= kv.num_physical_pages
        assert kv.num_virtual_pages == sum(r.virtual_pages for r in live) <= kv.num_virtual_pages_limit
        assert all(r.mapped_pages <= r.virtual_pages for r in live)
