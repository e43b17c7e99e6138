"""The Python bindings in a world of one, host kind (tests/python/api_np1.sh
sets 8 segments of 1M per rank, no reserve, a 16M spill tier)."""

import asyncio
import ctypes
import gc
import os
import re
import selectors
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402

import numpy as np  # noqa: E402

import ema  # noqa: E402
from ema import _lib  # noqa: E402

MiB = 1 << 20
NUMPY_VERSION = tuple(int(x) for x in np.__version__.split(".")[:2])
SEG = MiB


def setUpModule():
    ema.init()


def tearDownModule():
    ema.finalize()


class TestStatus(unittest.TestCase):
    def test_every_status_maps_to_its_class_name_and_strerror(self):
        names = {v: k for k, v in _lib.STATUS_NAMES.items()}
        # the table is ema.h's enum, value for value
        hdr = open(os.path.join(os.environ["top_srcdir"], "include", "ema.h")).read()
        enum = dict((n, int(v)) for n, v in re.findall(r"\b(EMA_(?:SUCCESS|INPROGRESS|ERR_\w+))"
                                                      r"\s*=\s*(-?\d+)", hdr))
        self.assertEqual(enum, names)
        for code, name in _lib.STATUS_NAMES.items():
            text = ema.strerror(code)
            self.assertTrue(text and text != "unknown status", (code, text))
            if code >= 0:
                self.assertEqual(ema.check(code), code)
                continue
            cls = ema.ERRORS[code]
            self.assertTrue(issubclass(cls, ema.EmaError))
            self.assertIs(getattr(ema, cls.__name__), cls)
            with self.assertRaises(cls) as cm:
                ema.check(code, "ema_fake_call")
            e = cm.exception
            self.assertEqual((e.code, e.name, e.call, e.message), (code, name, "ema_fake_call", text))
            self.assertIn(name, str(e))
        self.assertEqual(len(ema.ERRORS), 15)
        self.assertTrue(issubclass(ema.InvalidParamError, ValueError))
        self.assertTrue(issubclass(ema.TimeoutError, TimeoutError))
        self.assertIs(ema.ERRORS[-23], ema.TimeoutError)
        self.assertIs(ema.ERRORS[-4], ema.RangeError)
        with self.assertRaises(ema.EmaError) as cm:
            ema.check(-99)
        self.assertEqual(cm.exception.name, "EMA_ERR_-99")
        self.assertEqual(ema.strerror(-99), "unknown status")


class TestWorld(unittest.TestCase):
    def test_world_of_one(self):
        self.assertTrue(ema.is_initialized())
        self.assertEqual((ema.rank(), ema.size()), (0, 1))
        self.assertEqual(ema.memory_kind(), ema.MemoryKind.HOST)
        self.assertRegex(ema.version(), r"^\d+\.\d+\.\d+$")
        self.assertIn("EMA_DEVICE_MEMORY=8M", ema.config_text().replace("8388608", "8M"))
        self.assertIn("memory kind", ema.info_text())
        ema.barrier()
        self.assertIn(ema.progress(), (True, False))

    def test_mem_stat_has_every_field(self):
        st = ema.mem_stat()
        names = [n for n, _ in _lib.MEM_STAT_FIELDS]
        self.assertEqual(list(st.asdict())[:len(names)], names)
        self.assertEqual((st.capacity, st.reserve, st.memory_kind, st.device),
                         (8 * MiB, 0, ema.MemoryKind.HOST, -1))
        self.assertIsInstance(st.reclaim_last_us, float)
        self.assertEqual(st.bytes_free + st.bytes_used + st.bytes_lent, st.capacity)

    def test_stat_layout_matches_the_header(self):
        hdr = open(os.path.join(os.environ["top_srcdir"], "include", "ema.h")).read()
        body = hdr[:hdr.index("} ema_win_stat_t;")]
        body = body[body.rindex("typedef struct"):]
        want = "field_mask" if "field_mask" in body else "plain"
        self.assertEqual(_lib.detect_stat_layout(), want)
        for n, _ in _lib.WIN_STAT_FIELDS:
            self.assertIn(" %s;" % n, body)
        self.assertEqual(ema.mem_stat().field_mask is None, want == "plain")
        if want == "field_mask":
            # libema wrote every field it knows: exactly those described here
            w = ema.Window.allocate(MiB)
            self.addCleanup(w.free)
            self.assertEqual(w.stat().field_mask, (1 << len(_lib.WIN_STAT_FIELDS)) - 1)
            nmem = len(_lib.MEM_STAT_FIELDS) + len(_lib.MEM_STAT_LATER)
            self.assertEqual(ema.mem_stat().field_mask, (1 << nmem) - 1)
            self.assertIsNotNone(ema.mem_stat().bytes_unmet)
            for cls, fields in zip(_lib.STAT_LAYOUTS["field_mask"],
                                   (_lib.WIN_STAT_FIELDS, _lib.MEM_STAT_FIELDS)):
                self.assertEqual(ctypes.sizeof(cls), 8 + ctypes.sizeof(
                    _lib.STAT_LAYOUTS["plain"][0 if fields is _lib.WIN_STAT_FIELDS else 1]) + 64)

    def test_gil_is_released_by_every_call(self):
        # ctypes.CDLL (not PyDLL) drops the GIL around each foreign call
        self.assertIsInstance(_lib.lib, ctypes.CDLL)
        self.assertNotIsInstance(_lib.lib, ctypes.PyDLL)
        for name in _lib._PROTOS:
            fn = getattr(_lib.lib, name)
            self.assertFalse(fn._flags_ & ctypes._FUNCFLAG_PYTHONAPI, name)


class TestWindow(harness.Case):
    def setUp(self):
        super().setUp()
        self.win = ema.Window.allocate(2 * MiB, max_size="32M")

    def tearDown(self):
        if not self.win.freed:
            self.win.free()

    def test_put_get_flush_atomics_and_requests(self):
        w = self.win
        self.assertEqual(w.size(), 2 * MiB)
        self.assertEqual(w.size(0), 2 * MiB)
        data = os.urandom(4096)
        w.put(0, 100, data)
        w.flush(0)
        w.flush_all()
        self.assertEqual(bytes(w.get(0, 100, 4096)), data)
        out = np.zeros(4096, np.uint8)
        self.assertIs(w.get(0, 100, out), out)
        self.assertEqual(out.tobytes(), data)
        # any buffer: memoryview, array, numpy (2-d, contiguous), bytearray
        arr = np.arange(64, dtype=np.float64).reshape(8, 8)
        w.put(0, 8192, arr)
        back = np.empty_like(arr)
        w.get(0, 8192, back)
        self.assertTrue((back == arr).all())
        w.put(0, 0, memoryview(b"\0" * 16))
        self.assertEqual(w.fetch_add(0, 8, 5), 0)
        self.assertEqual(w.fetch_add(0, 8, 2 ** 64 - 1), 5)  # wraps: -1
        self.assertEqual(w.compare_swap(0, 8, 4, 99), 4)
        self.assertEqual(w.compare_swap(0, 8, 4, 7), 99)
        self.assertEqual(int.from_bytes(w.get(0, 8, 8), "little"), 99)
        src = bytearray(os.urandom(MiB))
        r = w.put_nb(0, MiB, src)
        with self.assertRaises(BufferError):  # held while in flight
            src.extend(b"x")
        r.wait()
        src.extend(b"x")  # released once complete
        self.assertTrue(r.done)
        dst = bytearray(MiB)
        r = w.get_nb(0, MiB, dst)
        while not r.test():
            pass
        self.assertEqual(bytes(dst), bytes(src[:MiB]))
        with w.get_nb(0, 0, bytearray(16)) as r2:
            pass
        self.assertTrue(r2.done)

    def test_calls_raise_the_status_libema_returns(self):
        w = self.win
        cases = [
            (ema.InvalidRankError, lambda: w.put(5, 0, b"x")),
            (ema.InvalidRankError, lambda: w.get(-1, 0, 1)),
            (ema.InvalidRankError, lambda: w.size(1)),
            (ema.RangeError, lambda: w.get(0, 2 * MiB - 1, 2)),
            (ema.RangeError, lambda: w.put(0, 2 * MiB, b"x")),
            (ema.RangeError, lambda: w.put_nb(0, 2 * MiB, b"x")),
            (ema.RangeError, lambda: w.acquire(MiB, 2 * MiB)),
            (ema.RangeError, lambda: w.view(MiB, 2 * MiB)),
            (ema.AlignmentError, lambda: w.fetch_add(0, 3, 1)),
            (ema.AlignmentError, lambda: w.compare_swap(0, 4, 0, 1)),
            (ema.InvalidParamError, lambda: ema.reclaim(0)),
            (ema.InvalidParamError, lambda: ema.reclaim(1 << 40)),
            (ema.InvalidParamError, lambda: ema.reclaim_release(MiB)),
            (ema.InvalidParamError, lambda: w.acquire(0, 0)),
            (ema.InvalidParamError, lambda: w.release(0, 4096)),
            (ema.InvalidParamError, lambda: w.grow(64 * MiB)),  # past max_size
            (ema.InvalidParamError, lambda: w.grow(MiB)),  # smaller
            (ema.InvalidParamError, lambda: w.shrink(4 * MiB)),  # larger
            (ema.NoMemoryError, lambda: w.grow(30 * MiB)),  # 8M + 16M spill
            (ema.NoMemoryError, lambda: ema.reclaim(8 * MiB)),  # 2M back our window
        ]
        for cls, fn in cases:
            with self.assertRaises(cls):
                fn()
        self.assertEqual(w.stat().size, 2 * MiB)  # a failed call changes nothing
        w.free()
        self.assertTrue(w.freed)
        for fn in (lambda: w.free(), lambda: w.put(0, 0, b"x"), lambda: w.stat(),
                   lambda: w.size(), lambda: w.grow(4 * MiB), lambda: w.view(0, 8),
                   lambda: w.flush_all(), lambda: w.prefetch(0, 8)):
            with self.assertRaises(ema.InvalidHandleError):
                fn()

    def test_bad_arguments_raise_before_the_call(self):
        w = self.win
        cases = [
            (TypeError, lambda: w.put(0, 0, 123)),
            (TypeError, lambda: w.put(0, 0, "text")),
            (TypeError, lambda: w.put("0", 0, b"x")),
            (TypeError, lambda: w.put(True, 0, b"x")),
            (ValueError, lambda: w.put(0, -1, b"x")),
            (ValueError, lambda: w.get(0, 0, -5)),
            (BufferError, lambda: w.get(0, 0, b"read-only")),
            (BufferError, lambda: w.get_nb(0, 0, memoryview(b"ro"))),
            (ValueError, lambda: w.fetch_add(0, 0, 2 ** 64)),
            (ValueError, lambda: w.fetch_add(0, 0, -1)),
            (TypeError, lambda: w.compare_swap(0, 0, 1.0, 2)),
            (ValueError, lambda: ema.Window.allocate("12Q")),
            (TypeError, lambda: ema.Window.allocate(1.5)),
            (ValueError, lambda: ema.reclaim(-1)),
            (TypeError, lambda: w.view(0, 8, dtype="float128")),
            (ValueError, lambda: w.view(0, 8, dtype=">f4")),
            (ValueError, lambda: w.view(2, 8, dtype="uint32")),  # misaligned
            (ValueError, lambda: w.view(0, 10, dtype="uint32")),
            (ValueError, lambda: w.view(0, 64, dtype="uint32", shape=(4, 5))),
            (ValueError, lambda: w.view(0, 0)),
        ]
        for cls, fn in cases:
            with self.assertRaises(cls, msg=str(cls)):
                fn()
        # one type for a buffer EMA cannot use, whichever exporter refused
        # (numpy raises ValueError, memoryview and bytes BufferError)
        strided = np.arange(64, dtype=np.uint8)[::2]
        ro = np.zeros(8, dtype=np.uint8)
        ro.flags.writeable = False
        for fn in (lambda: w.put(0, 0, strided), lambda: w.put(0, 0, memoryview(strided)),
                   lambda: w.get(0, 0, ro), lambda: w.get(0, 0, b"read-only")):
            with self.assertRaises(ema.UnusableBufferError) as cm:
                fn()
            self.assertIsInstance(cm.exception, ValueError)
            self.assertIsInstance(cm.exception, BufferError)
        # an offset past the part's end is a range error, nbytes given or not
        with self.assertRaises(ema.RangeError):
            w.view(w.size() + 4096)
        with self.assertRaises(ema.RangeError):
            w.view(w.size() + 4096, 16)
        self.assertEqual(ema.parse_size("2G"), 2 << 30)
        self.assertEqual(ema.parse_size("1KiB"), 1024)

    def test_stat_grow_shrink_and_spill(self):
        w = self.win
        st = w.stat()
        self.assertEqual([f for f in st.asdict()][:7], [n for n, _ in _lib.WIN_STAT_FIELDS])
        self.assertEqual((st.size, st.max_size, st.bytes_local), (2 * MiB, 32 * MiB, 2 * MiB))
        w.grow(12 * MiB)  # 8M local in all, the rest spills
        st = w.stat()
        self.assertEqual((st.size, st.bytes_local, st.bytes_spilled, st.bytes_borrowed),
                         (12 * MiB, 8 * MiB, 4 * MiB, 0))
        self.assertEqual(st.bytes_local + st.bytes_borrowed + st.bytes_spilled, st.size)
        self.assertEqual(ema.mem_stat().bytes_spilled, 4 * MiB)
        w.shrink(3 * MiB + 100)
        self.assertEqual(w.size(), 3 * MiB + 100)
        self.assertEqual(w.stat().bytes_spilled, 0)


class TestViews(harness.Case):
    def setUp(self):
        super().setUp()
        self.win = ema.Window.allocate(4 * MiB, max_size="16M")
        self.data = os.urandom(4 * MiB)
        self.win.put(0, 0, self.data)
        self.win.flush(0)

    def tearDown(self):
        self.win.free()

    def ema_get(self, off, n):
        return bytes(self.win.get(0, off, n))

    def test_views_match_ema_get_byte_for_byte(self):
        w = self.win
        for off, n, dt, shape in [(0, 4 * MiB, None, None), (8, 4096, "uint64", None),
                                  (MiB + 4, 4000, "float32", (10, 100)),
                                  (3 * MiB, MiB, np.int16, None), (64, 64, "bool", (8, 8)),
                                  (256, 512, "float16", None), (512, 1024, "complex64", None),
                                  (128, 256, "float64", (4, 8))]:
            v = w.view(off, n, dtype=dt, shape=shape)
            want = self.ema_get(off, n)
            self.assertEqual(bytes(memoryview(v)), want, (off, n, dt))   # buffer protocol
            self.assertEqual(v.numpy().tobytes(), want)
            self.assertEqual(np.asarray(v).tobytes(), want)
            if v.dtype.name == "bool" and NUMPY_VERSION < (1, 25):
                continue  # numpy 1.24 does not know DLPack's kDLBool
            self.assertEqual(np.from_dlpack(v).tobytes(), want, (off, n, dt))  # DLPack
            a = np.from_dlpack(v)
            self.assertEqual(a.ctypes.data, w.base + off)  # the window's memory, no copy
            self.assertEqual(a.dtype, np.dtype(v.dtype.typestr))
            self.assertEqual(a.shape, v.shape)
        # stores through each interface are seen by ema_get
        v = w.view(2 * MiB, 64 * 1024, "uint32")
        d = np.from_dlpack(v)  # read-only in numpy 1.x; writable where numpy allows
        v.numpy()[:] = np.arange(16384, dtype=np.uint32)
        self.assertEqual(self.ema_get(2 * MiB, 64 * 1024), np.arange(16384, dtype=np.uint32).tobytes())
        self.assertEqual(d.tobytes(), np.arange(16384, dtype=np.uint32).tobytes())
        if d.flags.writeable:
            d[:] = 5
            self.assertEqual(self.ema_get(2 * MiB, 4), (5).to_bytes(4, "little"))
        del d
        memoryview(v).cast("B")[:4] = b"\xff\xff\xff\xff"
        self.assertEqual(self.ema_get(2 * MiB, 4), b"\xff" * 4)
        v.numpy()[1] = 7
        self.assertEqual(self.ema_get(2 * MiB + 4, 4), (7).to_bytes(4, "little"))
        # and a put is seen through the view
        w.put(0, 2 * MiB, b"\x01\x00\x00\x00")
        self.assertEqual(v.numpy()[0], 1)
        # a view is itself a buffer for put
        w.put(0, 0, w.view(2 * MiB, 16))
        self.assertEqual(self.ema_get(0, 16), self.ema_get(2 * MiB, 16))
        self.assertEqual(ema.dtype_of("torch.bfloat16").code, 4)
        self.assertEqual(w.view(0, 8, dtype="bfloat16").shape, (4,))
        self.assertEqual(len(w.view(0).numpy()), 4 * MiB)  # the rest of the part

    def test_dlpack_capsules_by_hand(self):
        v = self.win.view(4096, 8 * 24, "int64", shape=(8, 3))
        self.assertEqual(v.__dlpack_device__(), (1, 0))
        self.assertFalse(hasattr(v, "__cuda_array_interface__"))
        get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
        get_ptr.restype, get_ptr.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
        set_name = ctypes.pythonapi.PyCapsule_SetName
        set_name.restype, set_name.argtypes = ctypes.c_int, [ctypes.py_object, ctypes.c_char_p]
        for versioned in (False, True):
            cap = v.__dlpack__(max_version=(1, 0)) if versioned else v.__dlpack__(stream=None)
            name = b"dltensor_versioned" if versioned else b"dltensor"
            st = ema.views.DLManagedTensorVersioned if versioned else ema.views.DLManagedTensor
            m = st.from_address(get_ptr(cap, name))
            if versioned:
                self.assertEqual((m.version.major, m.version.minor, m.flags), (1, 0, 0))
            t = m.dl_tensor
            self.assertEqual((t.data, t.device.device_type, t.device.device_id, t.ndim),
                             (self.win.base + 4096, 1, 0, 2))
            self.assertEqual((t.dtype.code, t.dtype.bits, t.dtype.lanes), (0, 64, 1))
            self.assertEqual((t.shape[0], t.shape[1], t.strides[0], t.strides[1], t.byte_offset),
                             (8, 3, 3, 1, 0))
            self.assertEqual(v.exports, 1)
            # the consumer's side: rename, then call the deleter when done
            set_name(cap, b"used_" + name)
            del cap
            self.assertEqual(v.exports, 1)
            m.deleter(ctypes.addressof(m))
            self.assertEqual(v.exports, 0)
        cap = v.__dlpack__()  # never consumed: the capsule's destructor deletes it
        self.assertEqual(v.exports, 1)
        del cap
        gc.collect()
        self.assertEqual(v.exports, 0)
        with self.assertRaises(BufferError):
            v.__dlpack__(copy=True)
        with self.assertRaises(BufferError):
            v.__dlpack__(dl_device=(2, 0))
        self.assertEqual(v.__dlpack__(copy=False, dl_device=(1, 0)).__class__.__name__, "PyCapsule")
        gc.collect()
        v.close()
        with self.assertRaises(BufferError):
            v.__dlpack__()

    def test_pinned_view_holds_its_range_until_closed(self):
        w = self.win
        v = w.view(MiB, MiB, pin=True)
        self.assertTrue(v.pinned)
        # acquires nest: releasing once more than ours fails, ours is there
        w.release(MiB, MiB)
        w.acquire(MiB, MiB)
        a = np.from_dlpack(v)
        with self.assertRaises(BufferError):  # a consumer still holds it
            v.close()
        del a
        gc.collect()
        v.close()
        self.assertTrue(v.closed and not v.pinned)
        with self.assertRaises(BufferError):  # its memory may be gone
            v.numpy()
        with self.assertRaises(ema.InvalidParamError):
            w.release(MiB, MiB)  # nothing held any more
        with w.view(0, 4096, pin=True) as v2:
            self.assertTrue(v2.pinned)
        with self.assertRaises(ema.InvalidParamError):
            w.release(0, 4096)
        v3 = w.view(0, 4096, pin=True)
        del v3  # garbage collection releases too
        gc.collect()
        with self.assertRaises(ema.InvalidParamError):
            w.release(0, 4096)
        with w.acquire(0, 8192) as held:
            self.assertEqual((held.offset, held.nbytes), (0, 8192))
        with self.assertRaises(ema.InvalidParamError):
            w.release(0, 8192)

    def test_numpy_arrays_hold_a_pinned_view_like_dlpack(self):
        # close() dropped the pin under a live numpy() array, a shrink then
        # unmapped the range, and reading the array crashed (SIGSEGV)
        w = self.win
        v = w.view(2 * MiB, MiB, "uint32", pin=True)
        a = v.numpy()
        b = a[4:8]  # an array made from the array holds it too
        self.assertEqual(v.exports, 1)
        with self.assertRaisesRegex(BufferError, "array"):
            v.close()
        self.assertTrue(v.pinned and not v.closed)
        with self.assertRaises(ema.StateError):  # the pin is still there
            w.shrink(MiB)
        del a
        gc.collect()
        with self.assertRaises(BufferError):  # b still holds it
            v.close()
        b[0] = 7
        del b
        gc.collect()
        self.assertEqual(v.exports, 0)
        v.close()
        self.assertFalse(v.pinned)

    def test_refused_dlpack_capsule_releases_its_export(self):
        # numpy 1.24 refuses a bool tensor and drops the capsule with its own
        # error pending: the export used to leak (and its pin, so free()
        # failed for good), and numpy raised SystemError
        if ema.notify.load_helper() is None:
            self.skipTest("the _notify helper (the C capsule destructor) is not built")
        w = self.win
        v = w.view(0, 64, "bool", pin=True)
        try:
            np.from_dlpack(v)
        except SystemError as e:
            self.fail("the consumer's error was lost: %r" % e)
        except (RuntimeError, TypeError, BufferError):
            pass  # numpy refused it (1.24); a later numpy may take bool
        gc.collect()
        self.assertEqual(v.exports, 0)
        v.close()
        self.assertFalse(v.pinned)

    def test_failed_free_closes_no_view(self):
        w = ema.Window.allocate(4 * MiB)
        pins = [w.view(i * MiB, MiB, pin=True) for i in range(3)]
        held = w.view(3 * MiB, MiB, pin=True)
        a = np.from_dlpack(held)
        with self.assertRaises(BufferError):
            w.free()
        self.assertFalse(w.freed)
        self.assertEqual([p.closed for p in pins], [False] * 3)
        self.assertTrue(all(p.pinned for p in pins + [held]))
        del a
        gc.collect()
        w.free()
        self.assertTrue(all(p.closed for p in pins + [held]))

    def test_prefetch_moves_unpinned_ranges_home_only(self):
        # 4M local + 2M of a filler; grown to 10M: [6M, 10M) spills
        filler = ema.Window.allocate(2 * MiB)
        w = self.win
        try:
            w.grow(10 * MiB)
            tail = os.urandom(6 * MiB)
            w.view(4 * MiB, 6 * MiB).numpy()[:] = np.frombuffer(tail, np.uint8)
            self.assertEqual(w.stat().bytes_spilled, 4 * MiB)
        finally:
            filler.free()  # 2M of local memory free
        n = ema.ReclaimNotifier()
        with self.assertRaisesRegex(TypeError, "must be an ema.Window"):
            n.watch(42)
        n.watch(w)
        n.read(0)
        pinned = w.view(6 * MiB, 2 * MiB, pin=True)
        w.prefetch(0, 10 * MiB)  # [8M, 10M) comes home; the pinned range stays
        self.assertTrue(harness.poll(lambda: w.stat().bytes_spilled == 2 * MiB), w.stat())
        ev = n.read(1.0)
        self.assertEqual([(e.window, e.offset, e.nbytes) for e in ev], [(w, 8 * MiB, 2 * MiB)])
        time.sleep(0.05)
        self.assertEqual(w.stat().bytes_spilled, 2 * MiB)
        self.assertEqual(self.ema_get(4 * MiB, 6 * MiB), tail)
        pinned.close()
        w.shrink(8 * MiB)  # frees [8M, 10M): room for the last 2M
        w.prefetch(0, 8 * MiB)
        self.assertTrue(harness.poll(lambda: w.stat().bytes_spilled == 0), w.stat())
        self.assertEqual(self.ema_get(0, 4 * MiB), self.data)
        self.assertEqual(self.ema_get(4 * MiB, 4 * MiB), tail[:4 * MiB])
        ev = n.read(1.0)
        self.assertEqual([(e.offset, e.nbytes) for e in ev], [(6 * MiB, 2 * MiB)])
        n.unwatch(w)


    def test_policy_keeps_the_groups_ahead_local(self):
        # 4M of data + 8M more: 8M local, [8M, 12M) spills; 6 groups of 2M
        w = self.win
        w.grow(12 * MiB)
        tail = os.urandom(8 * MiB)
        w.put(0, 4 * MiB, tail)
        w.flush(0)
        self.assertEqual(w.stat().bytes_spilled, 4 * MiB)
        groups = [(g * 2 * MiB, 2 * MiB) for g in range(6)]
        for cls, fn in [
                (ema.StateError, lambda: w.advance(0)),  # no policy yet
                (ema.InvalidParamError, lambda: w.set_policy([(0, 2 * MiB), (MiB, 2 * MiB)])),
                (ema.InvalidParamError, lambda: w.set_policy(groups, depth=7)),
                (ema.RangeError, lambda: w.set_policy([(11 * MiB, 2 * MiB)]))]:
            with self.assertRaises(cls):
                fn()
        for bad in (lambda: w.set_policy(groups, depth=0), lambda: w.set_policy([(0,)]),
                    lambda: w.advance(-1)):
            with self.assertRaises((ValueError, TypeError)):
                bad()
        self.assertEqual(w.policy_stat().count, 0)  # the failed calls set nothing
        w.set_policy(groups, depth=2)
        st = w.policy_stat()
        self.assertEqual((st.count, st.depth, st.group), (6, 2, None))
        w.advance(3)  # groups 4 and 5, [8M, 12M), come home; groups behind go out
        self.assertTrue(harness.poll(lambda: w.policy_stat().bytes_ahead_local == 4 * MiB),
                        w.policy_stat())
        st = w.policy_stat()
        self.assertEqual((st.group, st.bytes_ahead), (3, 4 * MiB))
        self.assertGreaterEqual(st.bytes_prefetched, 4 * MiB)
        self.assertGreaterEqual(st.bytes_evicted, 4 * MiB)
        self.assertEqual(w.stat().bytes_spilled, 4 * MiB)  # as much as before, elsewhere
        self.assertEqual(self.ema_get(0, 4 * MiB), self.data)
        self.assertEqual(self.ema_get(4 * MiB, 8 * MiB), tail)
        w.set_policy(None)
        self.assertEqual(w.policy_stat().count, 0)
        with self.assertRaises(ema.StateError):
            w.advance(0)
        # read_only: groups brought home from the spill tier keep their spill
        # copies; walking two laps, the groups just passed leave for those
        # copies (bytes_dropped) with no copy
        w.set_policy(groups, depth=2, cyclic=True, read_only=True)
        for g in list(range(6)) * 2:
            w.advance(g)
            self.assertTrue(harness.poll(lambda: w.policy_stat().bytes_ahead_local == 4 * MiB),
                            w.policy_stat())
        st = w.policy_stat()
        self.assertGreater(st.bytes_dropped, 0, st)
        self.assertLessEqual(st.bytes_dropped, st.bytes_evicted)
        self.assertGreater(ema.mem_stat().bytes_spilled, w.stat().bytes_spilled)  # the copies
        self.assertEqual(self.ema_get(0, 4 * MiB), self.data)
        self.assertEqual(self.ema_get(4 * MiB, 8 * MiB), tail)
        w.set_policy(None)  # the copies go back to the spill tier
        self.assertEqual(ema.mem_stat().bytes_spilled, w.stat().bytes_spilled)
        self.assertEqual(self.ema_get(4 * MiB, 8 * MiB), tail)
        # wait: advance(g) returns once group g is local; the policy stat
        # then counts it among the groups to keep local (first of them)
        w.set_policy(groups, depth=1, cyclic=True, wait=True)
        for g in list(range(6)) * 2:
            w.advance(g)
            st = w.policy_stat()
            self.assertEqual((st.group, st.bytes_ahead), (g, 4 * MiB), st)
            self.assertGreaterEqual(st.bytes_ahead_local, 2 * MiB, st)
        self.assertEqual(self.ema_get(0, 4 * MiB), self.data)
        self.assertEqual(self.ema_get(4 * MiB, 8 * MiB), tail)
        w.set_policy(None)


class TestNotifier(unittest.TestCase):
    """Moves in a world of one: a shrink that brings spilled segments home
    calls the reclaim callback on the calling thread (ema_win_set_reclaim_cb(3))."""

    def alloc(self, size, max_size=None):
        w = ema.Window.allocate(size, max_size=max_size)
        self.addCleanup(lambda: w.freed or w.free())
        return w

    def spilled_then_home(self, win, other):
        win.grow(10 * MiB)  # 6M local (2M are other's), 4M spilled
        self.assertEqual(win.stat().bytes_spilled, 4 * MiB)
        other.free()
        win.shrink(8 * MiB)  # moves the 2M of [6M, 8M) home

    def test_pipe_events_name_the_range_about_to_move(self):
        n = ema.ReclaimNotifier()
        self.assertEqual(n.mode, "pipe")
        self.assertIs(ema.ReclaimNotifier(), n)  # one per process
        win = self.alloc(4 * MiB, "16M")
        other = self.alloc(2 * MiB)
        n.watch(win)
        self.assertEqual(n.read(0), [])
        sel = selectors.DefaultSelector()
        sel.register(n, selectors.EVENT_READ)
        self.spilled_then_home(win, other)
        self.assertTrue(sel.select(timeout=5))
        ev = n.read()
        self.assertEqual([(e.window, e.offset, e.nbytes) for e in ev], [(win, 6 * MiB, 2 * MiB)])
        self.assertTrue(ev[0].overlaps(win.view(7 * MiB, 8)))
        self.assertFalse(ev[0].overlaps(win.view(0, 8)))
        self.assertEqual(n.dropped, 0)
        sel.close()
        # asyncio: await the next events
        win.shrink(4 * MiB)
        other = self.alloc(2 * MiB)

        async def go():
            t = asyncio.get_running_loop().run_in_executor(None, self.spilled_then_home, win, other)
            got = await asyncio.wait_for(n.wait(), 10)
            await t
            return got
        got = asyncio.run(go())
        self.assertEqual([(e.offset, e.nbytes) for e in got], [(6 * MiB, 2 * MiB)])
        n.unwatch(win)
        win.shrink(4 * MiB)
        other = self.alloc(2 * MiB)
        self.spilled_then_home(win, other)
        self.assertEqual(n.read(0.2), [])  # unwatched
        win.free()

    def test_hold_makes_the_move_wait_for_the_ack(self):
        n = ema.ReclaimNotifier()
        win = self.alloc(4 * MiB, "16M")
        other = self.alloc(2 * MiB)
        n.watch(win, hold=10.0)
        win.grow(10 * MiB)
        other.free()
        expired, seen = n.expired, {}

        def holder():  # stops using the range (here: 0.3 s), then acks
            seen["events"] = n.read(timeout=10)
            time.sleep(0.3)
            seen["acked_at"] = time.monotonic()
            n.ack(seen["events"])
        t = threading.Thread(target=holder)
        t.start()
        win.shrink(8 * MiB)  # its move's callback runs here, and waits
        returned_at = time.monotonic()
        t.join()
        self.assertEqual([(e.offset, e.nbytes) for e in seen["events"]], [(6 * MiB, 2 * MiB)])
        self.assertGreater(seen["events"][0].seq, 0)
        self.assertGreaterEqual(returned_at, seen["acked_at"])
        self.assertEqual(n.expired, expired)
        # with no one to ack, the hold ends by itself, and says so
        n.watch(win, hold=0.2)
        win.shrink(4 * MiB)
        other = self.alloc(2 * MiB)
        win.grow(10 * MiB)  # [8M, 10M) spills again
        other.free()
        t0 = time.monotonic()
        win.shrink(8 * MiB)
        took = time.monotonic() - t0
        self.assertTrue(0.2 <= took < 5, took)
        self.assertEqual(n.expired, expired + 1)
        self.assertEqual(len(n.read(0)), 1)
        n.ack()
        n.unwatch(win)
        win.free()

    def test_poll_mode_reports_after_the_fact(self):
        n = ema.ReclaimNotifier(mode="poll", poll_interval=0.005)
        self.assertEqual(n.mode, "poll")
        win = self.alloc(4 * MiB, "16M")
        other = self.alloc(2 * MiB)
        n.watch(win)
        self.spilled_then_home(win, other)
        ev = n.read(5)
        self.assertEqual([(e.window, e.offset, e.nbytes) for e in ev], [(win, 0, 8 * MiB)])
        n.close()
        win.free()

    def test_callback_runs_while_python_holds_the_gil(self):
        # A Python thread holds the GIL (a huge switch interval, a loop of
        # plain memory reads) while the main thread's shrink runs the reclaim
        # callback: the callback's record count must move meanwhile.  A
        # callback that took the GIL would wait for the loop to end.
        n = ema.ReclaimNotifier()
        sent = ctypes.c_uint64.in_dll(ema.notify.load_helper(), "ema_py_notify_nsent")
        win = self.alloc(4 * MiB, "16M")
        other = self.alloc(2 * MiB)
        n.watch(win)
        win.grow(10 * MiB)
        other.free()
        base = sent.value
        go, seen = threading.Event(), []

        def hold_the_gil():
            go.wait()
            end = time.monotonic() + 3.0
            while time.monotonic() < end:
                if sent.value != base:
                    seen.append(True)
                    break
        t = threading.Thread(target=hold_the_gil)
        t.start()
        old = sys.getswitchinterval()
        sys.setswitchinterval(100.0)
        try:
            go.set()
            win.shrink(8 * MiB)
        finally:
            sys.setswitchinterval(old)
        t.join()
        self.assertEqual(seen, [True])
        self.assertEqual(len(n.read(1)), 1)
        n.unwatch(win)
        win.free()


if __name__ == "__main__":
    sys.exit(harness.main("python test_api"))
