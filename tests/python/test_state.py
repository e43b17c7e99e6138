"""The Python bindings across the life of a process: before init, a failed
init, a good one, after finalize (tests/python/state_np1.sh); and
EMA_ERR_BOOTSTRAP from a launcher whose PMIx server cannot be reached.
The cases run in this order, in one process (EMA is initialised once)."""

import os
import subprocess
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import ema  # noqa: E402

MiB = 1 << 20
unittest.TestLoader.sortTestMethodsUsing = None  # keep the order of definition


class TestLife(unittest.TestCase):
    def test_1_calls_before_init_raise_state(self):
        self.assertFalse(ema.is_initialized())
        for fn in (ema.rank, ema.size, ema.barrier, ema.progress, ema.mem_stat, ema.finalize,
                   ema.memory_kind, lambda: ema.reclaim(MiB), lambda: ema.reclaim_release(MiB),
                   lambda: ema.Window.allocate(MiB)):
            with self.assertRaises(ema.StateError):
                fn()
        # safe at any time
        self.assertTrue(ema.version())
        self.assertEqual(ema.strerror(-6), ema.StateError().message)
        self.assertIn("EMA_DEVICE_MEMORY", ema.config_text())
        self.assertIn("before ema_init", ema.info_text())
        self.assertIn("<ema.World (not initialised)>", repr(ema.World()))

    def test_2_failed_inits_change_nothing(self):
        with self.assertRaises(ValueError):
            ema.init(memory_kind="gpu")
        with self.assertRaises(TypeError):
            ema.init(memory_kind=1.0)
        with self.assertRaises(ema.InvalidParamError):
            ema.init(memory_kind=7)
        with self.assertRaises(ema.InvalidParamError):
            ema.init(device_memory=0)
        with self.assertRaises(ema.InvalidParamError):
            ema.init(segment_size=3000)  # not a multiple of 4 KiB
        self.assertFalse(ema.is_initialized())

    def test_3_cuda_without_a_gpu_is_unsupported(self):
        try:
            w = ema.init(memory_kind="cuda")
        except ema.UnsupportedError as e:
            self.assertEqual(e.name, "EMA_ERR_UNSUPPORTED")
            return
        # a GPU is here: a cuda world of one works; the later cases need
        # a fresh process, so they are left to the host kind's runs
        self.assertEqual(ema.memory_kind(), ema.MemoryKind.CUDA)
        w.__exit__(None, None, None)
        raise unittest.SkipTest("a GPU is present: no EMA_ERR_UNSUPPORTED to see")

    def test_4_init_once_then_finalize_with_a_block(self):
        if ema.is_initialized() or ema.core._State.finalized:
            raise unittest.SkipTest("initialised already (cuda)")
        with ema.init(memory_kind="host", device_memory="8M", segment_size="1M") as world:
            self.assertEqual((world.rank, world.size), (0, 1))
            self.assertEqual(ema.mem_stat().capacity, 8 * MiB)
            with self.assertRaises(ema.StateError):
                ema.init()
            win = ema.Window.allocate(MiB)
            view = win.view(0, 4096, pin=True)
            win2 = ema.Window.allocate(MiB)
            with win2:
                win2.put(0, 0, b"abc")
            self.assertTrue(win2.freed)
        # finalize freed the windows the program left, and closed the views
        self.assertFalse(ema.is_initialized())
        self.assertTrue(win.freed and view.closed and not view.pinned)
        for fn in (ema.rank, ema.barrier, lambda: win.put(0, 0, b"x"), lambda: win.stat(),
                   win.free, ema.finalize):
            with self.assertRaises((ema.StateError, ema.InvalidHandleError)):
                fn()
        with self.assertRaises(ema.StateError):
            ema.init()  # once per process
        del view

    def test_5_unreachable_launcher_is_a_bootstrap_error(self):
        env = dict(os.environ, PMIX_NAMESPACE="bogus", PMIX_RANK="0",
                   PMIX_SERVER_URI4="bogus.0;tcp4://127.0.0.1:1")
        code = ("import ema\ntry:\n    ema.init()\nexcept ema.BootstrapError as e:\n"
                "    print('BOOTSTRAP', e.name, e.code)\n")
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=60)
        self.assertIn("BOOTSTRAP EMA_ERR_BOOTSTRAP -20", out.stdout, out.stderr)
        self.assertLess(time.monotonic() - t0, 30)


if __name__ == "__main__":
    sys.exit(harness.main("python test_state"))
