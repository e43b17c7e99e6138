"""Builds the optional C helper ema/_notify (reclaim events without the GIL)
where a C compiler is present; without one the package installs all the
same and ema.ReclaimNotifier falls back to polling (mode "poll").  The
metadata is in pyproject.toml."""
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class OptionalBuildExt(build_ext):
    def run(self):
        try:
            super().run()
        except Exception as e:  # no compiler: pure Python install
            print("ema: _notify not built (%s); ReclaimNotifier will poll" % e)

    def build_extension(self, ext):
        try:
            super().build_extension(ext)
        except Exception as e:
            print("ema: %s not built (%s); ReclaimNotifier will poll" % (ext.name, e))

    def get_export_symbols(self, ext):
        return []  # loaded with ctypes, not imported: no PyInit_ function


setup(
    ext_modules=[Extension("ema._notify", ["ema/_notify.c"], optional=True)],
    cmdclass={"build_ext": OptionalBuildExt},
)
