#!/usr/bin/env python3
"""cuda_consumer: a GPU consumer of an EMA window view, without torch or CuPy.

    mpirun -n 2 python3 examples/python/cuda_consumer.py [MiB, default 256]
    python3 examples/python/cuda_consumer.py           # a world of one

Every rank joins with the cuda memory kind and MiB of device memory.  Rank 0
allocates a window part that fills all of its memory, writes pattern A into
it with a kernel, and grows the part to twice that size: the new half is
borrowed from the other ranks, mapped behind the first at the same address
(in a world of one, rank 0 fills half of its memory and grows locally).
Then, through a pinned view of the whole half-borrowed part:

  1. __cuda_array_interface__: a kernel of _gpu_check.so, called through
     ctypes with the interface's device pointer, writes pattern B into the
     borrowed half, then checks every word of the part (A, then B) and
     rewrites it (^ MASK);
  2. DLPack: the view's capsule is consumed in C (_gpu_check.so reads the
     DLManagedTensorVersioned, runs a kernel that checks every rewritten
     word, and calls the tensor's deleter), as torch.from_dlpack would;
  3. the host checks every word too, with ema_get, on rank 0 and on rank 1
     (which reads rank 0's part, through the lenders' memory);
  4. with 3 or more ranks: the pin is dropped, the top lender reclaims its
     memory (rank 0's pages move to another lender, at the same address)
     and the kernel checks every word again.

Needs _gpu_check.so (built by make where nvcc is found; or set
EMA_GPU_CHECK_LIBRARY) and numpy only for the host check.  Prints one PASS
or FAIL line per rank; exits 0, 1 (fail) or 77 (skip: no GPU, no
_gpu_check.so, or a libema without CUDA).
"""

import ctypes
import sys

import ema
from ema import _lib

EXIT_SKIP = 77
SALT_A, SALT_B, MASK = 0x1111, 0x2222, 0xA5A5A5A5A5A5A5A5
MiB = 1 << 20


def skip(why):
    print("SKIP: cuda_consumer: %s" % why)
    sys.exit(EXIT_SKIP)


def load_gpu_check():
    path = _lib.find_helper("_gpu_check", "EMA_GPU_CHECK_LIBRARY")
    if path is None:
        skip("_gpu_check.so was not built (no nvcc at configure time); "
             "set EMA_GPU_CHECK_LIBRARY to its path")
    try:
        g = ctypes.CDLL(path)
    except OSError as e:
        skip("cannot load %s: %s" % (path, e))
    u64, ull_p = ctypes.c_uint64, ctypes.POINTER(ctypes.c_ulonglong)
    g.ema_py_gpu_count.restype = ctypes.c_int
    g.ema_py_gpu_error_string.restype = ctypes.c_char_p
    g.ema_py_gpu_error_string.argtypes = [ctypes.c_int]
    g.ema_py_gpu_fill.argtypes = [ctypes.c_int, u64, u64, u64, u64]
    g.ema_py_gpu_check.argtypes = [ctypes.c_int, u64, u64, u64, u64, u64, u64, ctypes.c_int,
                                   u64, ull_p]
    g.ema_py_gpu_consume_dlpack.argtypes = [ctypes.c_void_p, ctypes.c_int, u64, u64, u64, u64,
                                            ull_p, ctypes.POINTER(u64)]
    return g


def pattern(n, first, salt, mask=0):
    """The host's copy of _gpu_check.cu's pattern (numpy)."""
    import numpy as np
    i = np.arange(first, first + n, dtype=np.uint64)
    x = (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(salt)
    return (x ^ (x >> np.uint64(29))) ^ np.uint64(mask)


class Run:
    def __init__(self, gpu):
        self.gpu = gpu
        self.ok = True
        self.me = ema.rank()

    def cuda(self, err, what):
        if err:
            self.fail("%s: %s" % (what, self.gpu.ema_py_gpu_error_string(err).decode()))
        return err == 0

    def fail(self, msg):
        print("cuda_consumer: rank %d: FAIL: %s" % (self.me, msg))
        self.ok = False

    def host_check(self, win, nwords, half, what):
        """Check rank 0's part [0, nwords) words with ema_get, in chunks."""
        try:
            import numpy as np
        except ImportError:
            print("cuda_consumer: rank %d: no numpy, host check of %s skipped" % (self.me, what))
            return
        chunk = 4 * MiB // 8
        bad = 0
        for first in range(0, nwords, chunk):
            k = min(chunk, nwords - first)
            got = np.empty(k, dtype=np.uint64)
            win.get(0, first * 8, got)
            want = np.where(np.arange(first, first + k) < half, pattern(k, first, SALT_A, MASK),
                            pattern(k, first, SALT_B, MASK))
            bad += int(np.count_nonzero(got != want))
        if bad:
            self.fail("%s: %d of %d words wrong (ema_get)" % (what, bad, nwords))
        else:
            print("cuda_consumer: rank %d: %s: %d words checked with ema_get" % (self.me, what, nwords))

    def kernel_check(self, dev, ptr, nwords, half, mask_in, rewrite, what):
        errors = ctypes.c_ulonglong()
        if self.cuda(self.gpu.ema_py_gpu_check(dev, ptr, nwords, half, SALT_A, SALT_B, mask_in,
                                               int(rewrite), MASK, ctypes.byref(errors)), what):
            if errors.value:
                self.fail("%s: %d of %d words wrong (kernel)" % (what, errors.value, nwords))
            else:
                print("cuda_consumer: rank 0: %s: %d words checked by a kernel" % (what, nwords))


def consume_dlpack(run, view, half):
    """A DLPack consumer in C: take the capsule's tensor, as from_dlpack does."""
    capsule = view.__dlpack__(max_version=(1, 0), stream=None)
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    rename = ctypes.pythonapi.PyCapsule_SetName
    rename.restype, rename.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
    managed = get(capsule, b"dltensor_versioned")
    rename(capsule, b"used_dltensor_versioned")  # the consumer owns it now
    errors, n = ctypes.c_ulonglong(), ctypes.c_uint64()
    err = run.gpu.ema_py_gpu_consume_dlpack(managed, 1, half, SALT_A, SALT_B, MASK,
                                            ctypes.byref(errors), ctypes.byref(n))
    if run.cuda(err, "DLPack consumer"):
        if errors.value or n.value != view.shape[0]:
            run.fail("DLPack consumer: %d wrong of %d words" % (errors.value, n.value))
        else:
            print("cuda_consumer: rank 0: DLPack: %d words checked by a kernel" % n.value)
    if view.exports:
        run.fail("the DLPack deleter was not called")


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    gpu = load_gpu_check()
    if gpu.ema_py_gpu_count() <= 0:
        skip("no GPU (cudaGetDeviceCount found none)")
    try:
        ema.init(memory_kind="cuda", device_memory=mib * MiB)
    except ema.UnsupportedError as e:
        skip("ema_init with the cuda kind: %s" % e)
    run = Run(gpu)
    me, n = ema.rank(), ema.size()
    dev = ema.mem_stat().device
    ctl = ema.Window.allocate(4096)  # takes a segment of each rank's memory

    # rank 0's part: all of its free memory (half in a world of one), grown x2
    free = ema.mem_stat().bytes_free
    own = free if n > 1 else free // 2
    if me == 0:  # every rank needs rank 0's numbers
        ctl.put(0, 0, own.to_bytes(8, "little"))
        ctl.flush(0)
    ema.barrier()
    own = int.from_bytes(ctl.get(0, 0, 8), "little")
    ema.barrier()
    size = 2 * own
    win = ema.Window.allocate(own if me == 0 else 0, max_size=size if me == 0 else None)
    nwords, half = size // 8, own // 8
    if me == 0:
        run.cuda(gpu.ema_py_gpu_fill(dev, win.base, 0, half, SALT_A), "fill A")
        win.grow(size)
        st = win.stat()
        print("cuda_consumer: rank 0: part of %d MiB: %d local, %d borrowed (device %d)"
              % (st.size // MiB, st.bytes_local // MiB, st.bytes_borrowed // MiB, dev))
        if n > 1 and st.bytes_borrowed != own:
            run.fail("the part is not half borrowed: %s" % st)
        # 1. __cuda_array_interface__, on a view pinned while kernels run
        with win.view(0, size, "uint64", pin=True) as view:
            cai = view.__cuda_array_interface__
            ptr = cai["data"][0]
            if cai["shape"] != (nwords,) or cai["typestr"] != "<u8" or ptr != win.base:
                run.fail("__cuda_array_interface__ = %r" % cai)
            run.cuda(gpu.ema_py_gpu_fill(dev, ptr, half, nwords, SALT_B), "fill B (borrowed half)")
            run.kernel_check(dev, ptr, nwords, half, 0, True, "__cuda_array_interface__")
            # 2. DLPack
            if view.__dlpack_device__() != (2, dev):
                run.fail("__dlpack_device__ = %r" % (view.__dlpack_device__(),))
            consume_dlpack(run, view, half)
    ema.barrier()
    # 3. the host checks, through ema_get: rank 0 and rank 1 (via the lenders)
    if me == 0 or me == 1:
        run.host_check(win, nwords, half, "rank 0's part")
    ema.barrier()
    # 4. a reclaim moves the borrowed pages while unpinned; the kernel checks again
    if n >= 3:
        ctl.put(0, 64 + 8 * me, ema.mem_stat().bytes_lent.to_bytes(8, "little"))
        ctl.flush(0)
        ema.barrier()
        lent = [int.from_bytes(ctl.get(0, 64 + 8 * r, 8), "little") for r in range(n)]
        lender = max(range(1, n), key=lambda r: lent[r])
        if me == lender:
            st = ema.mem_stat()
            ema.reclaim(st.bytes_free + st.bytes_lent, 10000)
            print("cuda_consumer: rank %d: reclaimed %d MiB in %.0f us"
                  % (me, lent[me] // MiB, ema.mem_stat().reclaim_last_us))
        ema.barrier()
        if me == 0:
            print("cuda_consumer: rank 0: after the reclaim: %s" % win.stat())
            with win.view(0, size, "uint64", pin=True) as view:
                run.kernel_check(dev, view.__cuda_array_interface__["data"][0], nwords, half,
                                 MASK, False, "after the reclaim")
        if me == lender:
            ema.reclaim_release(ema.mem_stat().bytes_withheld)
        ema.barrier()
    win.free()
    ctl.free()
    ema.finalize()
    print("cuda_consumer: rank %d: %s" % (me, "PASS" if run.ok else "FAIL"))
    return 0 if run.ok else 1


if __name__ == "__main__":
    sys.exit(main())
