"""The Python bindings on 4 ranks, host kind (tests/python/elastic_np4.sh:
16 segments of 1M per rank, nothing reserved, spill to host).  Rank 0 owns
a window that grows past its memory into its peers'; a lender reclaims; the
data is checked through numpy views (rank 0) and ema_get (the others).

Every case is collective; failures are collected with expect() and asserted
after the last collective call (harness.Case)."""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import numpy as np  # noqa: E402

import ema  # noqa: E402

MiB = 1 << 20
SEG = MiB
CTL_GATHER = 0     # 8 words per rank
CTL_FLAG = 2048    # a word rank 0's event thread adds to, at the lender
ctl = None


def setUpModule():
    global ctl
    ema.init()
    if ema.size() != 4:
        raise unittest.SkipTest("needs 4 ranks (mpirun -n 4), not %d" % ema.size())
    ctl = ema.Window.allocate(4096)


def pattern(first_word, nwords, seed):
    i = np.arange(first_word, first_word + nwords, dtype=np.uint64)
    x = (i + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15) ^ np.uint64(seed)
    return x ^ (x >> np.uint64(29))


def allgather(*words):
    """Every rank's words (up to 8 uint64), as a list indexed by rank."""
    me, n = ema.rank(), ema.size()
    ctl.put(0, CTL_GATHER + me * 64, np.array(words, dtype=np.uint64))
    ctl.flush(0)
    ema.barrier()
    out = np.zeros(n * 8, dtype=np.uint64)
    ctl.get(0, CTL_GATHER, out)
    ema.barrier()
    return [[int(w) for w in out[r * 8:r * 8 + len(words)]] for r in range(n)]


def poll(fn, limit=20.0):
    """harness.poll, with the longer limit of 4 ranks' migrations."""
    return harness.poll(fn, limit)


def settle():
    """Wait until memory lent for earlier windows has come back everywhere."""
    ok = poll(lambda: ema.mem_stat().bytes_lent == 0 and ema.mem_stat().bytes_withheld == 0)
    ema.barrier()
    return ok


class Grown:
    """Rank 0's part of a new window, made once the memory of earlier ones
    has come back: all of its free memory, then grown by extra bytes
    (borrowed), filled with pattern(seed) through a numpy view.  The other
    ranks' parts are empty.  L is the top lender, take what it can reclaim
    (its free memory and what it lent)."""

    def __init__(self, case, extra, max_size, seed):
        case.expect(settle(), "memory did not come back before the test")
        self.me = ema.rank()
        self.own = ema.mem_stat().bytes_free if self.me == 0 else 0
        self.win = ema.Window.allocate(self.own, max_size=max_size if self.me == 0 else None)
        self.size = self.own + extra
        if self.me == 0:
            self.win.grow(self.size)
            st = self.win.stat()
            case.expect(st.bytes_local == self.own and st.bytes_borrowed == extra,
                        "after the grow: %s", st)
            self.view = self.win.view(0, self.size, "uint64")
            self.words = self.view.numpy()  # loads and stores, borrowed pages included
            self.words[:] = pattern(0, self.size // 8, seed)
        ema.barrier()  # the grow is over: the lenders' counters are final
        st = ema.mem_stat()
        words = allgather(st.bytes_lent, st.bytes_free, self.own)
        self.lent = [r[0] for r in words]
        self.free = [r[1] for r in words]
        self.own = words[0][2]  # rank 0's, known to all
        self.size = self.own + extra
        self.L = max(range(1, 4), key=lambda r: self.lent[r])  # the top lender
        self.take = self.free[self.L] + self.lent[self.L]
        case.expect(sum(self.lent) == extra, "lent in all %s, expected %d", self.lent, extra)

    def check_owner(self, case, lo, hi, seed, what):
        got = self.words[lo // 8:hi // 8]
        bad = np.flatnonzero(got != pattern(lo // 8, (hi - lo) // 8, seed))
        case.expect(bad.size == 0, "%s: %d bad words in [%d, %d), first at word %s", what,
                    bad.size, lo, hi, bad[:1])

    def check_remote(self, case, lo, hi, seed, what):
        got = np.empty((hi - lo) // 8, dtype=np.uint64)
        self.win.get(0, lo, got)
        bad = np.flatnonzero(got != pattern(lo // 8, got.size, seed))
        case.expect(bad.size == 0, "%s: %d bad words in [%d, %d) read with ema_get", what,
                    bad.size, lo, hi)

    def free_window(self):
        if self.me == 0:
            del self.words
            self.view.close()
        ema.barrier()
        self.win.free()

    def end(self, case):
        """A case's end: the top lender releases the take it reclaimed (and
        withholds), the window is freed, the expectations are asserted."""
        if self.me == self.L:
            ema.reclaim_release(self.take)
        self.free_window()
        case.assert_expectations()


class TestElastic(harness.Case):
    def test_1_grow_reclaim_shrink_through_numpy_views(self):
        me = ema.rank()
        g = Grown(self, 8 * SEG, 48 * MiB, seed=1)
        base0 = g.win.base
        ema.barrier()
        # the owner's stores are read by every other rank; they put into thirds
        # of the borrowed range, which the owner loads through the same view
        third = (8 * SEG) // 3 // 8 * 8
        lo = g.own + (me - 1) * third
        hi = g.size if me == 3 else lo + third
        if me != 0:
            g.check_remote(self, 0, g.size, 1, "owner's stores")
        # every rank has read the owner's stores before any overwrites its
        # third: without this barrier a slow reader saw a faster rank's
        # puts (a third of 8 MiB, 349525 words, every time under TSan;
        # 87860 words once in session 14's make check)
        ema.barrier()
        if me != 0:
            g.win.put(0, lo, pattern(lo // 8, (hi - lo) // 8, 2))
            g.win.flush(0)
        ema.barrier()
        if me == 0:
            g.check_owner(self, 0, g.own, 1, "local part")
            g.check_owner(self, g.own, g.size, 2, "peers' puts into the borrowed pages")
        ema.barrier()

        # the top lender takes back all it does not use; the data moves
        L = g.L
        if me == L:
            ema.reclaim(g.take, 10000)
            st = ema.mem_stat()
            self.expect(st.bytes_lent == 0 and st.bytes_withheld == g.take,
                        "lender after its reclaim: %s", st)
        ema.barrier()
        if me == 0:
            st = g.win.stat()
            self.expect(st.size == g.size and st.bytes_borrowed + st.bytes_spilled == 8 * SEG
                        and st.migrations >= g.lent[L] // SEG, "owner after the reclaim: %s", st)
            self.expect(g.win.base == base0, "the base moved")
            g.check_owner(self, 0, g.own, 1, "local part after the reclaim")
            g.check_owner(self, g.own, g.size, 2, "moved pages after the reclaim")
        elif me != L:
            g.check_remote(self, g.own, g.size, 2, "moved pages, ema_get")
        ema.barrier()

        # shrink into the middle of a segment: the kept bytes stay
        small = g.own + SEG + SEG // 4
        if me == 0:
            g.win.shrink(small)
            st = g.win.stat()
            self.expect(st.size == small and
                        st.bytes_local + st.bytes_borrowed + st.bytes_spilled == small,
                        "after the shrink: %s", st)
            g.check_owner(self, 0, g.own, 1, "local part after the shrink")
            g.check_owner(self, g.own, small, 2, "kept borrowed bytes after the shrink")
        ema.barrier()
        if me != 0:
            g.check_remote(self, g.own, small, 2, "kept bytes, ema_get")
            self.expect(g.win.size(0) == small, "ema_win_size(0) = %d", g.win.size(0))
        g.end(self)

    def test_2_pinned_view_holds_off_a_reclaim_until_closed(self):
        me = ema.rank()
        g = Grown(self, 4 * SEG, 32 * MiB, seed=3)
        L = g.L
        if me == 0:  # every borrowed byte pinned, as a kernel would need it
            pinned = g.win.view(g.own, 4 * SEG, "uint64", pin=True)
            arr = np.from_dlpack(pinned)  # a consumer's tensor holds the pin too
        ema.barrier()
        if me == L:
            t0 = time.monotonic()
            try:
                ema.reclaim(g.take, 300)
                self.expect(False, "the reclaim of pinned memory succeeded")
            except ema.TimeoutError as e:
                self.expect(e.name == "EMA_ERR_TIMEOUT", "%s", e)
            self.expect(time.monotonic() - t0 < 5, "the reclaim took %.1f s", time.monotonic() - t0)
            self.expect(ema.mem_stat().bytes_lent == g.lent[L], "the pinned memory moved: %s",
                        ema.mem_stat())
        ema.barrier()
        if me == 0:
            self.expect(g.win.stat().bytes_borrowed == 4 * SEG, "moved while pinned: %s",
                        g.win.stat())
            self.expect(bool((arr == pattern(g.own // 8, arr.size, 3)).all()), "tensor data")
            try:
                pinned.close()
                self.expect(False, "closed a pinned view a consumer still holds")
            except BufferError:
                pass
            del arr
            pinned.close()  # the recall goes on now, in the background
        if me == L:
            self.expect(poll(lambda: ema.mem_stat().bytes_lent == 0),
                        "the lender did not get its memory back after the unpin: %s",
                        ema.mem_stat())
        ema.barrier()
        if me == 0:
            g.check_owner(self, 0, g.size, 3, "after the deferred reclaim")
        g.end(self)

    def test_3_events_reach_python_while_the_main_thread_waits_in_barrier(self):
        # Rank 0's main thread waits in ema_barrier while its reader thread
        # (Python) reads the reclaim events of the lender's reclaim, acks
        # them (the moves wait for that: watch(hold=...)) and signals the
        # lender, which enters the barrier only once signalled.
        # If the barrier held the GIL, the reader could not run: deadlock,
        # caught by the lender's 20 s limit (and mpirun --timeout).
        me = ema.rank()
        g = Grown(self, 6 * SEG, 32 * MiB, seed=5)
        L = g.L
        events, state = [], {"in_barrier": False, "stop": False}
        if me == 0:
            # with a hold: each move waits for the reader's ack (made from
            # this Python thread, while the main thread waits in the barrier)
            n = ema.ReclaimNotifier()
            n.watch(g.win, hold=10.0)
            expired = n.expired

            def reader():
                while not state["stop"]:
                    evs = n.read(timeout=0.05)
                    if not evs:
                        continue
                    while not state["in_barrier"]:
                        time.sleep(0.001)
                    events.extend(evs)
                    n.ack(evs)  # "stopped using it": the move may go on
                    ctl.fetch_add(L, CTL_FLAG, len(evs))
            thread = threading.Thread(target=reader)
            thread.start()
        if me == L:
            ctl.put(L, CTL_FLAG, bytes(8))
            ctl.flush(L)
        ema.barrier()
        if me == 0:
            state["in_barrier"] = True
            ema.barrier()  # the GIL is released in here
            state["in_barrier"] = False
        elif me == L:
            ema.reclaim(g.take, 10000)
            signalled = poll(lambda: ctl.fetch_add(L, CTL_FLAG, 0) > 0)
            self.expect(signalled, "rank 0's Python thread never signalled: GIL held in "
                        "ema_barrier?")
            ema.barrier()
        else:
            ema.barrier()
        if me == 0:
            # wait for every event of the reclaim (the lender may have been
            # signalled after the first)
            poll(lambda: sum(e.nbytes for e in events) >= g.lent[L], 10)
            state["stop"] = True
            thread.join()
            got = sum(e.nbytes for e in events)
            self.expect(got == g.lent[L], "events for %d bytes, the lender lent %d: %s", got,
                        g.lent[L], events)
            self.expect(all(e.window is g.win and g.own <= e.offset and
                            e.offset + e.nbytes <= g.size for e in events), "events %s", events)
            self.expect(n.dropped == 0, "%d events dropped", n.dropped)
            self.expect(n.expired == expired, "%d holds expired unacknowledged",
                        n.expired - expired)
            g.check_owner(self, 0, g.size, 5, "after the reclaim")
            n.unwatch(g.win)
        ema.barrier()
        g.end(self)


def reduce_or(mask):
    words = allgather(mask) if ctl is not None else [[mask]]
    out = 0
    for w in words:
        out |= w[0]
    return out


if __name__ == "__main__":
    rc = harness.main("python test_elastic_np4", reduce_or=reduce_or)
    ema.finalize()
    sys.exit(rc)
