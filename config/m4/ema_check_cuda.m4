# EMA_CHECK_CUDA: --with-cuda=yes|no|DIR, default guess.
# The CUDA code is built whenever the toolkit's headers are found (nvcc is
# used for the examples).  The driver library is loaded with dlopen at run
# time, so a CUDA build still runs on a machine with no GPU or driver.
AC_DEFUN([EMA_CHECK_CUDA], [
  AC_ARG_WITH([cuda],
    [AS_HELP_STRING([--with-cuda@<:@=DIR@:>@], [build the cuda memory kind (default: guess)])],
    [], [with_cuda=guess])
  ema_have_cuda=no
  CUDA_HOME=
  AS_CASE(["$with_cuda"],
    [no], [],
    [yes|guess], [
      for d in "$CUDA_HOME" /usr/local/cuda `command -v nvcc 2>/dev/null | sed 's,/bin/nvcc$,,'` /usr; do
        AS_IF([test -n "$d" && test -f "$d/include/cuda.h"], [CUDA_HOME="$d"; break])
      done],
    [CUDA_HOME="$with_cuda"])
  AS_IF([test "x$with_cuda" != xno && test -n "$CUDA_HOME"], [
    ema_save_CPPFLAGS="$CPPFLAGS"
    CPPFLAGS="$CPPFLAGS -I$CUDA_HOME/include"
    AC_CHECK_HEADER([cuda.h], [ema_have_cuda=yes])
    CPPFLAGS="$ema_save_CPPFLAGS"])
  AS_IF([test "x$with_cuda" != xno && test "x$with_cuda" != xguess && test "x$ema_have_cuda" != xyes],
        [AC_MSG_ERROR([--with-cuda was given but cuda.h was not found])])
  CUDA_CPPFLAGS=
  NVCC=
  AS_IF([test "x$ema_have_cuda" = xyes], [
    CUDA_CPPFLAGS="-I$CUDA_HOME/include"
    AC_DEFINE([HAVE_CUDA], [1], [Build the cuda memory kind])
    AC_PATH_PROG([NVCC], [nvcc], [], [$CUDA_HOME/bin$PATH_SEPARATOR$PATH])])
  AC_SUBST([CUDA_CPPFLAGS])
  AC_SUBST([CUDA_HOME])
  AC_SUBST([NVCC])
  AM_CONDITIONAL([HAVE_CUDA], [test "x$ema_have_cuda" = xyes])
  AM_CONDITIONAL([HAVE_NVCC], [test -n "$NVCC"])
])
