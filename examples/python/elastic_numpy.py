#!/usr/bin/env python3
"""elastic_numpy: an EMA window as a numpy array that outgrows its memory.

    mpirun -n 4 python3 examples/python/elastic_numpy.py [CAP, default 32M]
    python3 examples/python/elastic_numpy.py          # a world of one

Each rank has CAP bytes of (host-kind) memory, a stand-in for a GPU.

  1. Rank 0 allocates a window part that fills its free memory (CAP less
     the small window the ranks exchange numbers in) and grows it by half:
     the new third is borrowed from the other ranks (in a world of one it
     spills to host memory), mapped behind the first at the same address.
  2. It fills the whole part through one numpy view, with no copy.
  3. The rank that lent the most reclaims its memory (ema.reclaim): rank 0's
     borrowed pages move to another lender or to the spill tier.  Rank 0
     hears which ranges moved (ema.ReclaimNotifier, read by a Python thread
     while its main thread waits in a barrier).
  4. Rank 0 checks every element through the same numpy array, and rank 1
     through ema_get; then the part is shrunk back and checked again.

Prints where the part's bytes live after each step; exits 0 if every check
passed, 77 (skipped) on a memory kind other than host, 1 otherwise.  EMA_*
variables override the defaults used here.
"""

import os
import sys
import threading

import numpy as np

import ema

MiB = 1 << 20


def pattern(nwords, seed):
    i = np.arange(nwords, dtype=np.uint64)
    x = (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(seed)
    return x ^ (x >> np.uint64(29))


def where(win):
    st = win.stat()
    return "size %5.1f MiB: %5.1f local, %5.1f borrowed, %5.1f spilled, %d migrations" % (
        st.size / MiB, st.bytes_local / MiB, st.bytes_borrowed / MiB, st.bytes_spilled / MiB,
        st.migrations)


def main():
    cap = ema.parse_size(sys.argv[1]) if len(sys.argv) > 1 else 32 * MiB
    params = {}
    # EMA_* variables win over these defaults; init's arguments would win over them
    if "EMA_MEMORY_KIND" not in os.environ:
        params["memory_kind"] = "host"
    if "EMA_DEVICE_MEMORY" not in os.environ:
        params["device_memory"] = cap
    if "EMA_SEGMENT_SIZE" not in os.environ:
        params["segment_size"] = "2M"
    ema.init(**params)
    if ema.memory_kind() != ema.MemoryKind.HOST:
        print("elastic_numpy: the numpy view needs the host kind (EMA_MEMORY_KIND=host); "
              "see cuda_consumer.py for GPUs")
        ema.finalize()
        return 77
    me, n = ema.rank(), ema.size()
    ok = True

    # a small window for exchanging a few numbers
    ctl = ema.Window.allocate(4096)
    def gather(value):
        ctl.put(0, 8 * me, np.array([value], dtype=np.uint64))
        ctl.flush(0)
        ema.barrier()
        out = np.zeros(n, dtype=np.uint64)
        ctl.get(0, 0, out)
        ema.barrier()
        return [int(v) for v in out]

    # 1. fill the own memory, then grow by half of it
    own = ema.mem_stat().bytes_free if me == 0 else 0
    own = gather(own)[0]
    size = own + own // 2
    win = ema.Window.allocate(own if me == 0 else 0, max_size=2 * own if me == 0 else None)
    if me == 0:
        win.grow(size)
        borrowed = win.stat().bytes_borrowed  # counted up to the part's size
        print("1. grown past its memory:  " + where(win))
        # 2. one numpy array over the whole part, borrowed pages included
        view = win.view(0, size, dtype="uint64")
        a = view.numpy()
        a[:] = pattern(a.size, 42)
        notifier = ema.ReclaimNotifier()
        notifier.watch(win)
        events = []
        stop = threading.Event()

        def listen():
            while not stop.is_set():
                events.extend(notifier.read(timeout=0.05))
        listener = threading.Thread(target=listen)
        listener.start()
    ema.barrier()

    # 3. the top lender takes its memory back
    lent = gather(ema.mem_stat().bytes_lent)
    lender = max(range(n), key=lambda r: lent[r]) if n > 1 else -1
    if me == lender:
        st = ema.mem_stat()
        ema.reclaim(st.bytes_free + st.bytes_lent, 10000)
        print("3. rank %d reclaimed %.1f MiB in %.0f us" % (me, lent[me] / MiB,
                                                           ema.mem_stat().reclaim_last_us))
    ema.barrier()  # rank 0's listener hears the moves meanwhile

    # 4. check
    if me == 0:
        print("   after the reclaim:       " + where(win))
        stop.set()
        listener.join()
        moved = sum(e.nbytes for e in events)
        print("   reclaim events: %d, %.1f MiB about to move%s" % (
            len(events), moved / MiB,
            " (lent by rank %d: %.1f MiB)" % (lender, lent[lender] / MiB) if n > 1 else
            " (a world of one lends nothing)"))
        # the events name ranges of the part, so a lent segment that the
        # part's end cuts counts up to that end, as in bytes_borrowed
        if n > 1 and moved != borrowed:
            print("FAIL: events for %d bytes, the part had borrowed %d" % (moved, borrowed))
            ok = False
        bad = np.count_nonzero(a != pattern(a.size, 42))
        print("4. rank 0 checked %d words through its numpy view: %d bad" % (a.size, bad))
        ok = ok and bad == 0
    if me == 1 % n and n > 1:
        got = np.empty(size // 8, dtype=np.uint64)
        win.get(0, 0, got)
        bad = np.count_nonzero(got != pattern(got.size, 42))
        print("4. rank %d checked %d words with ema_get: %d bad" % (me, got.size, bad))
        ok = ok and bad == 0
    ema.barrier()
    if me == 0:
        del a
        view.close()
        win.shrink(own)
        print("   shrunk back:             " + where(win))
        a = win.view(0, own, "uint64").numpy()
        bad = np.count_nonzero(a != pattern(a.size, 42))
        ok = ok and bad == 0 and win.stat().bytes_local == own
        print("   kept bytes checked: %d bad" % bad)
        notifier.unwatch(win)
        del a
    if me == lender:
        ema.reclaim_release(ema.mem_stat().bytes_withheld)
    ema.barrier()
    win.free()
    ok = gather(0 if ok else 1)
    ctl.free()
    ema.finalize()
    if me == 0:
        print("elastic_numpy: %s" % ("PASS" if not any(ok) else "FAIL on ranks %s"
                                     % [r for r, v in enumerate(ok) if v]))
    return 1 if any(ok) else 0


if __name__ == "__main__":
    sys.exit(main())
