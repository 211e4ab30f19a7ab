"""CUDA VMM backend on a real GPU: map on demand, exhaust the pool without crashing, unmap."""
import pytest

pytestmark = pytest.mark.gpu


def _driver_or_skip():
    try:
        from cuda.bindings import driver
    except ImportError:
        try:
            from cuda import cuda as driver
        except ImportError:
            pytest.skip("cuda-python is not installed")
    err, = driver.cuInit(0)[:1]
    if err != driver.CUresult.CUDA_SUCCESS or driver.cuDeviceGetCount()[1] < 1:
        pytest.skip("no CUDA device")
    return driver


def test_vmm_reserve_grow_release_and_exhaustion():
    _driver_or_skip()
    from serving.kv import KVAllocator, KVAllocatorConfig

    kv = KVAllocator(KVAllocatorConfig(pool_bytes=8 * 2 * 1024 ** 2, backend="cuda-vmm"))
    page = kv.page_bytes
    assert page % (2 * 1024 ** 2) == 0 or page >= 2 * 1024 ** 2
    a = kv.reserve(page, 8 * page, bytes_per_token=1)
    assert a is not None and a.mapped_pages == 1
    assert kv.grow(a, 4 * page) and kv.backend.num_mapped_pages == 4
    b = kv.reserve(4 * page, 4 * page, bytes_per_token=1)
    assert b is not None and kv.num_free_pages == 0
    assert not kv.grow(a, 5 * page)  # pool exhausted: a return value, not a crash
    kv.release(b)
    kv.release(a)
    assert kv.backend.num_mapped_pages == 0
