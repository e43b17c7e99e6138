"""Runs a test module's unittest cases on every rank and prints, on rank 0,
unittest's report and one summary line, "NAME: N passed, N failed, N
skipped".  Other ranks print their report only when something failed.
Exit status: 0 if every case passed (or skipped) on this rank, else 1.

Multi-rank cases are collective: every rank runs the same cases in the same
order (unittest sorts them by name).  They record failures with expect()
and assert only at the end, after the last collective call, so that one
rank's failure does not leave the others waiting in a barrier.
"""

import io
import os
import sys
import time
import unittest


def world_rank():
    for v in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK"):
        if v in os.environ:
            return int(os.environ[v])
    return 0


def poll(fn, limit=10.0):
    """Wait until fn() is true (asynchronous state: prefetch, memory coming
    back), at most limit seconds; whether it became true."""
    end = time.monotonic() + limit
    while not fn():
        if time.monotonic() > end:
            return False
        time.sleep(0.005)
    return True


class Case(unittest.TestCase):
    def setUp(self):
        self.failures_seen = []

    def expect(self, cond, msg, *args):
        if not cond:
            self.failures_seen.append(msg % args if args else msg)
        return cond

    def assert_expectations(self):
        if self.failures_seen:
            self.fail("rank %d: %s" % (world_rank(), "; ".join(self.failures_seen)))


def main(name, module="__main__", reduce_or=None):
    """Run the module's cases.  reduce_or(mask) -> the OR of every rank's
    mask (multi-rank tests): the summary then counts a case failed on any
    rank as failed, and the exit status says so on every rank."""
    rank = world_rank()
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[module])
    ids = sorted(t.id() for t in _cases(suite))  # before the run empties the suite
    stream = sys.stderr if rank == 0 else io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
    if rank != 0 and not result.wasSuccessful():
        sys.stderr.write("--- rank %d:\n%s" % (rank, stream.getvalue()))
    bad = {t.id() for t, _ in result.failures + result.errors}
    bad |= {t.id() for t in result.unexpectedSuccesses}
    mask = sum(1 << i for i, t in enumerate(ids) if t in bad)
    if reduce_or is not None:
        mask = reduce_or(mask)
    failed = bin(mask).count("1")
    skipped = len(result.skipped)
    passed = len(ids) - failed - skipped
    if rank == 0:
        sys.stderr.flush()
        print("%s: %d passed, %d failed, %d skipped" % (name, passed, failed, skipped))
    return 0 if failed == 0 else 1


def _cases(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _cases(t)
        else:
            yield t
