# EMA_CHECK_HWLOC: hwloc >= 2.0 through pkg-config.
AC_DEFUN([EMA_CHECK_HWLOC], [
  PKG_CHECK_MODULES([HWLOC], [hwloc >= 2.0], [],
    [AC_MSG_ERROR([hwloc >= 2.0 not found: install libhwloc-dev])])
  hwloc_version=`$PKG_CONFIG --modversion hwloc`
])
