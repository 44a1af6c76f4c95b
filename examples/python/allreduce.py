#!/usr/bin/env python3
"""Sum NumPy tensors of several worker processes through softrnic's
in-network aggregation: the lab's switch adds the workers' chunks, the
job's parameter server adds what the switch could not.

Each worker loads the C ABI (crates/aggregation/include/softrnic_aggregation.h)
with ctypes, sums float32 and int32 tensors with the other workers, and
checks every result against NumPy's own sum of every worker's tensor (each
worker can make the others' tensors: they come from seeded generators).
Integers must be exact; floats travel in fixed point with FRAC_BITS
fractional bits, so each sum is within workers * 2^-(FRAC_BITS+1) of the
exact one, plus float32 rounding.

scripts/python-allreduce.sh runs four of these and a server in the lab.
"""

import argparse
import ctypes
import sys

import numpy as np

FRAC_BITS = 16


class Allreduce:
    """One worker's handle on the job's allreduce."""

    def __init__(self, lib, local, server, job, worker, workers):
        self.lib = ctypes.CDLL(lib)
        self.lib.softrnic_agg_open.restype = ctypes.c_void_p
        self.lib.softrnic_agg_open.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_uint16, ctypes.c_uint8, ctypes.c_uint8]
        self.lib.softrnic_agg_allreduce_i32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        self.lib.softrnic_agg_allreduce_f32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32]
        self.lib.softrnic_agg_last_error.restype = ctypes.c_char_p
        self.lib.softrnic_agg_close.argtypes = [ctypes.c_void_p]
        self.handle = self.lib.softrnic_agg_open(local.encode(), server.encode(), job, worker, workers)
        if not self.handle:
            raise RuntimeError(self.error())

    def error(self):
        return self.lib.softrnic_agg_last_error().decode()

    def _check(self, rc):
        if rc < 0:
            raise RuntimeError(self.error())
        return rc == 1  # a sum saturated

    def sum_i32(self, a):
        assert a.dtype == np.int32 and a.flags.c_contiguous
        return self._check(self.lib.softrnic_agg_allreduce_i32(self.handle, a.ctypes.data, a.size))

    def sum_f32(self, a, frac_bits=FRAC_BITS):
        assert a.dtype == np.float32 and a.flags.c_contiguous
        return self._check(self.lib.softrnic_agg_allreduce_f32(self.handle, a.ctypes.data, a.size, frac_bits))

    def close(self):
        self.lib.softrnic_agg_close(self.handle)


def tensors(seed, step, workers, size):
    """Every worker's tensors of one step: floats and integers."""
    floats, ints = [], []
    for w in range(workers):
        rng = np.random.default_rng([seed, step, w])
        floats.append(rng.standard_normal(size).astype(np.float32))
        ints.append(rng.integers(-100_000, 100_000, size, dtype=np.int32))
    return floats, ints


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lib", required=True, help="path of libsoftrnic_aggregation.so")
    p.add_argument("--addr", required=True, help="this worker's address")
    p.add_argument("--server", required=True, help="the job's parameter server")
    p.add_argument("--job", type=int, default=1)
    p.add_argument("--worker", type=int, required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--size", type=int, default=100_000, help="values per tensor")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--seed", type=int, default=7)
    args = p.parse_args()

    agg = Allreduce(args.lib, args.addr, args.server, args.job, args.worker, args.workers)
    bound = args.workers * 2.0 ** -(FRAC_BITS + 1)
    worst = 0.0
    for step in range(args.steps):
        floats, ints = tensors(args.seed, step, args.workers, args.size)
        mine = floats[args.worker].copy()
        if agg.sum_f32(mine):
            sys.exit(f"worker {args.worker}: a float sum saturated")
        exact = np.sum(np.array(floats, dtype=np.float64), axis=0)
        error = np.abs(mine.astype(np.float64) - exact)
        # Fixed point's rounding, and float32's of the result.
        allowed = bound + np.abs(exact) * np.finfo(np.float32).eps
        if not np.all(error <= allowed):
            i = int(np.argmax(error - allowed))
            sys.exit(f"worker {args.worker} step {step}: value {i} is {mine[i]}, NumPy says {exact[i]}")
        worst = max(worst, float(error.max()))
        total = ints[args.worker].copy()
        agg.sum_i32(total)
        if not np.array_equal(total, np.sum(np.array(ints, dtype=np.int64), axis=0).astype(np.int32)):
            sys.exit(f"worker {args.worker} step {step}: the integer sum differs from NumPy's")
    agg.close()
    # One write, so that the workers' lines do not interleave.
    sys.stdout.write(f"worker {args.worker}: {args.steps} steps of {args.size} values, float32 within "
                     f"{worst:.2e} of NumPy (bound {bound:.2e}), int32 exact\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
