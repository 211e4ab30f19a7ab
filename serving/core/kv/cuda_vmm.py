"""The CUDA VMM page backend: virtual ranges from cuMemAddressReserve, pages from cuMemCreate + cuMemMap.

Every physical page is one allocation of the device's allocation granularity (usually 2 MiB),
so a range can grow and shrink page by page without copying. Unmapped pages are kept as spares and
mapped again without cuMemCreate (the pool's memory is the node's KV budget anyway); `trim()` gives
them back. New pages get their access rights in one call per run. A driver error while mapping
(out of memory above all) is reported as `False` so the allocator can reject or preempt a stage;
the serving process never dies of it. cuda-python is imported lazily: importing this module on a
machine without it is fine, constructing the backend is not.
"""

from __future__ import annotations

from serving.core.kv.backend import PageBackend


def cuda_driver():
    """cuda-python's driver module, initialised; RuntimeError saying why where there is no usable GPU."""
    try:
        from cuda.bindings import driver  # cuda-python >= 12.6
    except ImportError:
        try:
            from cuda import cuda as driver  # older cuda-python layout
        except ImportError as error:
            raise RuntimeError("the cuda-vmm KV backend needs cuda-python: pip install 'maestro[gpu]'") from error
    try:
        (err,) = driver.cuInit(0)
    except Exception as error:  # cuda-python raises when libcuda itself is missing (a CPU machine)
        raise RuntimeError(f"the cuda-vmm KV backend found no NVIDIA driver ({error}); use backend 'host'") from error
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuInit failed ({err}): no usable NVIDIA GPU; use backend 'host'")
    return driver


def _ok(driver, result, what: str):
    """Unpack a cuda-python (err, *values) tuple; raise on error (used only where failure is a bug)."""
    err, *values = result
    if err != driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    return values[0] if len(values) == 1 else values


class CudaVMMBackend(PageBackend):
    def __init__(self, page_bytes: int, num_physical_pages: int, device: int = 0):
        self._cu = cu = cuda_driver()
        dev = _ok(cu, cu.cuDeviceGet(device), "cuDeviceGet")
        self._context = _ok(cu, cu.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _ok(cu, cu.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
        self._prop = self._allocation_prop(device)
        self.granularity_bytes = int(
            _ok(
                cu,
                cu.cuMemGetAllocationGranularity(
                    self._prop, cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM
                ),
                "cuMemGetAllocationGranularity",
            )
        )
        # A page is a whole number of granules; round the requested size up.
        self.page_bytes = -(-page_bytes // self.granularity_bytes) * self.granularity_bytes
        self.num_physical_pages = num_physical_pages
        self._access = self._access_desc()
        self._ranges: dict[int, tuple[int, int]] = {}  # handle -> (base address, size in pages)
        self._pages: dict[int, list] = {}  # handle -> physical allocation handles, in slot order
        self._num_mapped = 0
        self._spare: list = []  # unmapped physical pages kept for reuse; mapped + spare <= num_physical_pages

    def _allocation_prop(self, device: int):
        cu = self._cu
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        return prop

    def _access_desc(self):
        cu = self._cu
        desc = cu.CUmemAccessDesc()
        desc.location = self._prop.location
        desc.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        return desc

    def reserve_range(self, num_pages: int) -> int | None:
        cu = self._cu
        err, base = cu.cuMemAddressReserve(max(1, num_pages) * self.page_bytes, 0, 0, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            return None
        handle = int(base)
        self._ranges[handle] = (handle, num_pages)
        self._pages[handle] = []
        return handle

    def map_pages(self, handle: int, first_page: int, num_pages: int) -> bool:
        cu, size, pages = self._cu, self.page_bytes, self._pages[handle]
        if first_page != len(pages) or first_page + num_pages > self._ranges[handle][1]:
            raise RuntimeError(f"range {handle:#x}: mapping slots {first_page}+{num_pages} breaks the mapped prefix")
        if self._num_mapped + num_pages > self.num_physical_pages:
            return False
        for slot in range(first_page, first_page + num_pages):
            if not self._map_one(handle, slot):
                self.unmap_pages(handle, first_page, slot - first_page)
                return False
        # One access call for the whole run of new pages (the range may span separate allocations).
        (err,) = cu.cuMemSetAccess(cu.CUdeviceptr(handle + first_page * size), num_pages * size, [self._access], 1)
        if err != cu.CUresult.CUDA_SUCCESS:
            self.unmap_pages(handle, first_page, num_pages)
            return False
        return True

    def _map_one(self, handle: int, slot: int) -> bool:
        cu, size = self._cu, self.page_bytes
        if self._spare:
            page = self._spare.pop()
        else:
            err, page = cu.cuMemCreate(size, self._prop, 0)
            if err != cu.CUresult.CUDA_SUCCESS:  # above all: the device is out of memory
                return False
        (err,) = cu.cuMemMap(cu.CUdeviceptr(handle + slot * size), size, 0, page, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            self._spare.append(page)
            return False
        self._pages[handle].append(page)
        self._num_mapped += 1
        return True

    def unmap_pages(self, handle: int, first_page: int, num_pages: int) -> None:
        """Unmap the tail of a range. Its physical pages stay with this backend as spares, so the next
        map skips cuMemCreate; `trim()` gives them back to the driver."""
        cu, size, pages = self._cu, self.page_bytes, self._pages[handle]
        if first_page + num_pages != len(pages):
            raise RuntimeError(f"range {handle:#x}: unmapping {first_page}+{num_pages} is not the mapped tail")
        for slot in reversed(range(first_page, first_page + num_pages)):
            _ok(cu, cu.cuMemUnmap(cu.CUdeviceptr(handle + slot * size), size), "cuMemUnmap")
            self._spare.append(pages.pop())
            self._num_mapped -= 1

    def trim(self) -> int:
        """Release the spare physical pages to the driver (e.g. before the model sleeps); returns how many."""
        released = len(self._spare)
        while self._spare:
            _ok(self._cu, self._cu.cuMemRelease(self._spare.pop()), "cuMemRelease")
        return released

    @property
    def num_spare_pages(self) -> int:
        return len(self._spare)

    def free_range(self, handle: int) -> None:
        if self._pages.pop(handle):
            raise RuntimeError(f"range {handle:#x} freed while pages are still mapped")
        base, num_pages = self._ranges.pop(handle)
        _ok(
            self._cu,
            self._cu.cuMemAddressFree(self._cu.CUdeviceptr(base), max(1, num_pages) * self.page_bytes),
            "cuMemAddressFree",
        )

    def base_address(self, handle: int) -> int:
        """The device address where a range starts (its mapped prefix is contiguous from there)."""
        return self._ranges[handle][0]

    @property
    def num_mapped_pages(self) -> int:
        return self._num_mapped
