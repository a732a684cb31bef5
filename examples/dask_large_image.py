"""Convolve an input larger than the workers' memory, from zarr on disk to zarr on disk, with Dask.

The input (``--size`` GiB of float32 images, 4 channels, ``--image`` pixels square, chunked in
bands of ``--band`` rows) is written to a zarr store first, block by block on the workers. Then
``convlib.conv2d`` of ``da.from_zarr(...)`` (3x3 filters, ``padding="same"``, 4 output channels)
is stored to a second zarr store: each band reads the first rows of the band below (its halo),
and is written as soon as it is computed, so a worker holds a few bands at a time, never the
image. The workers (``--workers`` processes, one dask thread and ``cores // workers`` numba
threads each) have a memory limit of ``--memory-limit`` each.

It reports the chunk plan, the peak resident memory of each worker (sampled every 20 ms in the
worker) and what it spilled to disk, whether a worker was restarted (killed), and the throughput; it checks a few bands
against the in-memory convolution. Exit status 1 when a check fails or a worker died.

    python examples/dask_large_image.py                      # 4 GiB in, 2 workers of 1 GiB
    python examples/dask_large_image.py --smoke              # seconds: 64 MiB, CI
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np


def _start_sampling(dask_worker):
    """In a worker: sample this process's resident memory every 20 ms, keep the peak."""
    import psutil

    process = psutil.Process()
    dask_worker.convlib_peak_rss = process.memory_info().rss
    dask_worker.convlib_spilled_before = _spilled(dask_worker)
    dask_worker.convlib_sampling = True

    def sample():
        while dask_worker.convlib_sampling:
            dask_worker.convlib_peak_rss = max(dask_worker.convlib_peak_rss, process.memory_info().rss)
            time.sleep(0.02)

    threading.Thread(target=sample, daemon=True).start()


def _spilled(dask_worker) -> float:
    """The bytes this worker spilled to disk since it started (its SpillBuffer's count of disk
    writes; 0 without a memory limit)."""
    return getattr(dask_worker.data, "cumulative_metrics", {}).get(("disk-write", "bytes"), 0)


def _stop_sampling(dask_worker):
    """In a worker: the peak resident memory and the bytes spilled since sampling started."""
    dask_worker.convlib_sampling = False
    return dask_worker.convlib_peak_rss, _spilled(dask_worker) - dask_worker.convlib_spilled_before


def _random_band(block, block_info=None):
    """The input, made where it is stored: a band seeded by its position (reproducible)."""
    location = block_info[None]["array-location"]
    seed = [location[0][0], location[2][0]]
    return np.random.default_rng(seed).standard_normal(block.shape, dtype=np.float32)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=float, default=4.0, help="input size in GiB (default 4)")
    p.add_argument("--image", type=int, default=4096, help="image height and width (default 4096)")
    p.add_argument("--band", type=int, default=512, help="rows per chunk (default 512)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--memory-limit", default="1GiB", help="per worker (default 1GiB)")
    p.add_argument("--dir", default=None, help="folder of the zarr stores (default: a new one under /tmp)")
    p.add_argument("--keep", action="store_true", help="keep the zarr stores")
    p.add_argument("--smoke", action="store_true", help="64 MiB of 512x512 images, 128-row bands: seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.size, args.image, args.band = 1 / 16, 512, 128

    import dask.array as da
    import dask.utils
    import distributed
    import zarr

    import convlib
    from convlib.dask import forward_plan

    channels = 4
    image_bytes = channels * args.image * args.image * 4
    n = max(1, round(args.size * 2**30 / image_bytes))
    shape = (n, channels, args.image, args.image)
    chunks = (1, channels, args.band, args.image)
    w = np.random.default_rng(1).standard_normal((channels, channels, 3, 3)).astype(np.float32)
    bias = np.arange(channels, dtype=np.float32)
    cores = os.cpu_count() or 1
    folder = args.dir or tempfile.mkdtemp(prefix="convlib-dask-", dir="/tmp")
    x_path, y_path = os.path.join(folder, "x.zarr"), os.path.join(folder, "y.zarr")
    ok = True
    try:
        with distributed.LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, memory_limit=args.memory_limit,
            dashboard_address=":0", silence_logs=40,
            env={"NUMBA_NUM_THREADS": str(max(1, cores // args.workers))},
        ) as cluster, distributed.Client(cluster) as client:
            workers_before = set(client.scheduler_info()["workers"])
            started = time.perf_counter()
            da.empty(shape, dtype=np.float32, chunks=chunks).map_blocks(_random_band, dtype=np.float32).to_zarr(
                x_path, overwrite=True)
            write_s = time.perf_counter() - started

            x = da.from_zarr(x_path)
            y = convlib.conv2d(x, w, bias, padding="same", algo="direct")
            plan = forward_plan(x, w, bias, padding="same")
            print(f"input {shape} float32 = {x.nbytes / 2**30:.2f} GiB in {x.npartitions} chunks of "
                  f"{np.prod(chunks) * 4 / 2**20:.0f} MiB ({x_path}); {args.workers} workers x "
                  f"{args.memory_limit} (dask: spill at 60%, pause at 80%, kill at 95%), 1 dask thread and "
                  f"{max(1, cores // args.workers)} numba thread(s) each")
            print(plan.describe())
            client.run(_start_sampling)
            started = time.perf_counter()
            y.to_zarr(y_path, overwrite=True)
            conv_s = time.perf_counter() - started
            peaks = client.run(_stop_sampling)
            workers_after = set(client.scheduler_info()["workers"])

        died = workers_before != workers_after
        limit = dask.utils.parse_bytes(args.memory_limit)
        print(f"wrote the input in {write_s:.1f} s; convolved zarr -> zarr in {conv_s:.1f} s: "
              f"{x.nbytes / conv_s / 1e9:.3f} GB/s of input ({(x.nbytes + y.nbytes) / conv_s / 1e9:.3f} GB/s "
              f"read + written)")
        for address, (peak, spilled) in sorted(peaks.items()):
            print(f"  worker {address}: peak resident memory {peak / 2**20:.0f} MiB "
                  f"({peak / limit * 100:.0f}% of its limit), {spilled / 2**20:.0f} MiB spilled to disk")
        print("  a worker was restarted (killed)" if died else "  no worker was restarted")
        ok = not died

        # A check: the first, a middle and the last band of the last image, against the in-memory call.
        stored = zarr.open(y_path, mode="r")
        source = zarr.open(x_path, mode="r")
        last = n - 1
        image = source[last:last + 1]
        expected = convlib.conv2d(image, w, bias, padding="same", algo="direct")
        for top in (0, (args.image // args.band // 2) * args.band, args.image - args.band):
            got = stored[last:last + 1, :, top:top + args.band]
            if not np.allclose(got, expected[:, :, top:top + args.band], rtol=1e-5, atol=1e-4):
                print(f"  MISMATCH in image {last}, rows {top}..{top + args.band - 1}")
                ok = False
        print("  checked 3 bands against the in-memory result:", "equal" if ok else "NOT EQUAL")
    finally:
        if not args.keep and args.dir is None:
            shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
