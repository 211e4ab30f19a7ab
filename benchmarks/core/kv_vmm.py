"""The CUDA VMM KV backend on a real GPU, each figure beside a baseline measured in the same run.

    python -m benchmarks.core.kv_vmm --out benchmarks/results/kv_vmm.json     (NVIDIA GPU + cuda-python)

1. One page in and out: map cold (cuMemCreate + cuMemMap + cuMemSetAccess), map warm (a spare page:
   cuMemMap + cuMemSetAccess) and unmap (cuMemUnmap) vs cuMemAlloc / cuMemFree of the same size.
2. A stage's KV growing during decode from 1 to N pages: mapping each new page into its reserved
   range (nothing is copied) vs a contiguous buffer that is reallocated and copied whenever it is
   full, doubling (the cheapest contiguous alternative, which over-allocates up to 2x).
3. The allocator's reserve / grow / release mix (benchmarks/core/ops.py) on cuda-vmm vs host.
4. Device memory the driver reports used while N pages are mapped vs the allocator's own count,
   after release (spares kept) and after trim().
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from benchmarks.core.ops import bench_allocator, write_results
from serving.core.kv import KVAllocator, KVAllocatorConfig
from serving.core.kv.cuda_vmm import cuda_driver

MiB = 1024**2


def _check(cu, result):
    err, *values = result
    if err != cu.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"CUDA call failed: {err}")
    return values[0] if len(values) == 1 else values


def _quantiles_us(seconds: list[float]) -> dict:
    us = np.asarray(seconds) * 1e6
    return {"p50_us": round(float(np.percentile(us, 50)), 1), "p99_us": round(float(np.percentile(us, 99)), 1)}


def _map_unmap(kv: KVAllocator, rounds: int) -> tuple[list[float], list[float]]:
    page, maps, unmaps = kv.page_bytes, [], []
    r = kv.reserve(0, rounds * page, bytes_per_token=1)
    for i in range(rounds):
        t0 = time.perf_counter()
        assert kv.grow(r, (i + 1) * page)
        maps.append(time.perf_counter() - t0)
    for i in reversed(range(rounds)):
        t0 = time.perf_counter()
        kv.shrink(r, i * page)
        unmaps.append(time.perf_counter() - t0)
    kv.release(r)
    return maps, unmaps


def bench_page_in_out(cu, kv: KVAllocator, rounds: int) -> dict:
    page = kv.page_bytes
    kv.backend.trim()
    cold, _ = _map_unmap(kv, rounds)
    warm, unmaps = _map_unmap(kv, rounds)
    kv.backend.trim()
    allocs, frees = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        ptr = _check(cu, cu.cuMemAlloc(page))
        t1 = time.perf_counter()
        _check(cu, cu.cuMemFree(ptr))
        allocs.append(t1 - t0)
        frees.append(time.perf_counter() - t1)
    out = {
        "page_bytes": page,
        "vmm_map_cold": _quantiles_us(cold),
        "vmm_map_warm": _quantiles_us(warm),
        "vmm_unmap": _quantiles_us(unmaps),
        "cuMemAlloc": _quantiles_us(allocs),
        "cuMemFree": _quantiles_us(frees),
    }
    for kind in ("cold", "warm"):
        out[f"map_{kind}_vs_cuMemAlloc_p50"] = round(out[f"vmm_map_{kind}"]["p50_us"] / out["cuMemAlloc"]["p50_us"], 2)
    return out


def _grow_by_mapping(cu, kv: KVAllocator, pages: int) -> float:
    page = kv.page_bytes
    t0 = time.perf_counter()
    r = kv.reserve(page, pages * page, bytes_per_token=1)
    for n in range(2, pages + 1):
        assert kv.grow(r, n * page)
    _check(cu, cu.cuCtxSynchronize())
    elapsed = time.perf_counter() - t0
    kv.release(r)
    return elapsed


def _grow_by_copying(cu, page: int, pages: int) -> float:
    t0 = time.perf_counter()
    capacity, ptr = 1, _check(cu, cu.cuMemAlloc(page))
    for n in range(2, pages + 1):
        if n > capacity:
            bigger = _check(cu, cu.cuMemAlloc(2 * capacity * page))
            _check(cu, cu.cuMemcpyDtoD(bigger, ptr, capacity * page))
            _check(cu, cu.cuMemFree(ptr))
            capacity, ptr = 2 * capacity, bigger
    _check(cu, cu.cuCtxSynchronize())
    elapsed = time.perf_counter() - t0
    _check(cu, cu.cuMemFree(ptr))
    return elapsed


def bench_growth(cu, kv: KVAllocator, pages: int, repeats: int) -> dict:
    """Time to grow one stage's KV from 1 to `pages` pages, one page at a time (as decode does)."""
    kv.backend.trim()
    cold = _grow_by_mapping(cu, kv, pages)
    warm = float(np.median([_grow_by_mapping(cu, kv, pages) for _ in range(repeats)]))
    kv.backend.trim()
    copying = float(np.median([_grow_by_copying(cu, kv.page_bytes, pages) for _ in range(repeats)]))
    return {
        "pages": pages,
        "bytes": pages * kv.page_bytes,
        "vmm_cold_ms": round(1e3 * cold, 3),
        "vmm_warm_ms": round(1e3 * warm, 3),
        "realloc_double_and_copy_ms": round(1e3 * copying, 3),
        "vmm_cold_vs_realloc": round(cold / copying, 2),
        "vmm_warm_vs_realloc": round(warm / copying, 2),
    }


def bench_driver_memory(cu, kv: KVAllocator, pages: int) -> dict:
    def free() -> int:
        return int(_check(cu, cu.cuMemGetInfo())[0])

    kv.backend.trim()
    before = free()
    r = kv.reserve(pages * kv.page_bytes, 3 * pages * kv.page_bytes, bytes_per_token=1)
    used = before - free()
    kv.release(r)
    held_as_spares = before - free()
    kv.backend.trim()
    return {
        "pages_mapped": pages,
        "virtual_pages_reserved": 3 * pages,
        "allocator_bytes": pages * kv.page_bytes,
        "driver_used_bytes_while_mapped": used,
        "driver_used_bytes_after_release": held_as_spares,
        "driver_used_bytes_after_trim": before - free(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="benchmarks/results/kv_vmm.json")
    parser.add_argument("--rounds", type=int, default=2000, help="pages mapped and unmapped in (1)")
    parser.add_argument("--allocator-ops", type=int, default=10000)
    args = parser.parse_args()
    cu = cuda_driver()
    kv = KVAllocator(KVAllocatorConfig(pool_bytes=32 * 1024**3, backend="cuda-vmm"))
    name = _check(cu, cu.cuDeviceGetName(256, 0)).split(b"\0")[0].decode()
    results = {
        "device": name,
        "machine": platform.machine(),
        "python": platform.python_version(),
        "page_in_out": bench_page_in_out(cu, kv, args.rounds),
        "growth": [bench_growth(cu, kv, pages, repeats=5) for pages in (8, 64, 512)],
        "driver_memory": bench_driver_memory(cu, kv, 1024),
    }
    vmm_ops = bench_allocator(args.allocator_ops, backend="cuda-vmm")
    host_ops = bench_allocator(args.allocator_ops, backend="host")
    results["allocator_ops_per_s"] = {
        "cuda-vmm": round(vmm_ops),
        "host": round(host_ops),
        "vmm_vs_host": round(vmm_ops / host_ops, 4),
    }
    write_results(results, args.out)


if __name__ == "__main__":
    main()
