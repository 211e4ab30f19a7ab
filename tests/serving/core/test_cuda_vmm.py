"""CUDA VMM backend on a real GPU: pages hold data as a range grows, the driver's memory follows the
mapped pages, and both the declared pool and the device itself running out are a `False`, not a crash."""

import numpy as np
import pytest

from serving.core.kv import KVAllocator, KVAllocatorConfig

pytestmark = pytest.mark.gpu

MiB = 1024**2


@pytest.fixture(scope="module")
def cu():
    from serving.core.kv.cuda_vmm import cuda_driver

    try:
        driver = cuda_driver()
    except RuntimeError as error:
        pytest.skip(str(error))
    if driver.cuDeviceGetCount()[1] < 1:
        pytest.skip("no CUDA device")
    return driver


def _free_bytes(cu) -> int:
    err, free, _total = cu.cuMemGetInfo()
    assert err == cu.CUresult.CUDA_SUCCESS
    return int(free)


def test_vmm_reserve_grow_release_and_exhaustion(cu):
    kv = KVAllocator(KVAllocatorConfig(pool_bytes=8 * 2 * MiB, backend="cuda-vmm"))
    page = kv.page_bytes
    assert page % (2 * MiB) == 0
    a = kv.reserve(page, 8 * page, bytes_per_token=1)
    assert a is not None and a.mapped_pages == 1
    assert kv.grow(a, 4 * page) and kv.backend.num_mapped_pages == 4
    b = kv.reserve(4 * page, 4 * page, bytes_per_token=1)
    assert b is not None and kv.num_free_pages == 0
    assert not kv.grow(a, 5 * page)  # pool exhausted: a return value, not a crash
    kv.release(b)
    kv.release(a)
    assert kv.backend.num_mapped_pages == 0


def test_mapped_pages_hold_data_as_the_range_grows_and_shrinks(cu):
    """Pages created one by one read back as one contiguous buffer: growth needs no copy."""
    kv = KVAllocator(KVAllocatorConfig(pool_bytes=16 * 2 * MiB, backend="cuda-vmm"))
    page = kv.page_bytes
    r = kv.reserve(page, 8 * page, bytes_per_token=1)
    base = kv.backend.base_address(r.handle)
    words = page // 4
    first = np.arange(words, dtype=np.uint32)
    assert cu.cuMemcpyHtoD(cu.CUdeviceptr(base), first.ctypes.data, page)[0] == cu.CUresult.CUDA_SUCCESS
    assert kv.grow(r, 4 * page) and r.mapped_pages == 4
    rest = np.full(3 * words, 0xA5A5A5A5, dtype=np.uint32)
    assert cu.cuMemcpyHtoD(cu.CUdeviceptr(base + page), rest.ctypes.data, 3 * page)[0] == cu.CUresult.CUDA_SUCCESS
    back = np.empty(4 * words, dtype=np.uint32)
    assert cu.cuMemcpyDtoH(back.ctypes.data, cu.CUdeviceptr(base), 4 * page)[0] == cu.CUresult.CUDA_SUCCESS
    assert np.array_equal(back[:words], first) and np.all(back[words:] == 0xA5A5A5A5)
    kv.shrink(r, page)
    assert r.mapped_pages == 1 and kv.backend.num_mapped_pages == 1
    head = np.empty(words, dtype=np.uint32)
    assert cu.cuMemcpyDtoH(head.ctypes.data, cu.CUdeviceptr(base), page)[0] == cu.CUresult.CUDA_SUCCESS
    assert np.array_equal(head, first)
    kv.release(r)


def test_driver_memory_follows_the_mapped_pages_and_spares_go_back_on_trim(cu):
    kv = KVAllocator(KVAllocatorConfig(pool_bytes=256 * 2 * MiB, backend="cuda-vmm"))
    page = kv.page_bytes
    before = _free_bytes(cu)
    r = kv.reserve(64 * page, 256 * page, bytes_per_token=1)
    taken = before - _free_bytes(cu)
    assert 64 * page <= taken <= 64 * page + 16 * MiB  # the virtual reserve itself costs no device memory
    kv.release(r)
    assert kv.backend.num_spare_pages == 64 and before - _free_bytes(cu) == taken  # kept for the next stage
    again = kv.reserve(32 * page, 64 * page, bytes_per_token=1)
    assert kv.backend.num_spare_pages == 32 and before - _free_bytes(cu) == taken  # reused, nothing created
    kv.release(again)
    assert kv.backend.trim() == 64
    assert abs(_free_bytes(cu) - before) <= 16 * MiB


def test_device_out_of_memory_is_a_false_and_the_allocator_keeps_working(cu):
    """Declare a pool twice the card, map 1 GiB pages until the driver says no."""
    err, _free, total = cu.cuMemGetInfo()
    page = 1024 * MiB
    kv = KVAllocator(KVAllocatorConfig(pool_bytes=2 * int(total), page_bytes=page, backend="cuda-vmm", overcommit=1.0))
    r = kv.reserve(page, kv.num_physical_pages * page, bytes_per_token=1)
    assert r is not None
    while kv.grow(r, (r.mapped_pages + 1) * page):
        assert r.mapped_pages <= kv.num_physical_pages
    assert r.mapped_pages * page <= total  # it stopped at the device, not at the declared pool
    assert r.mapped_pages * page >= 0.5 * _free
    kv.release(r)
    again = kv.reserve(4 * page, 8 * page, bytes_per_token=1)
    assert again is not None and again.mapped_pages == 4
    kv.release(again)
    assert kv.backend.num_mapped_pages == 0
    kv.backend.trim()
    assert _free_bytes(cu) >= _free - 64 * MiB  # every page went back to the driver
