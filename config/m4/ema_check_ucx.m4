# EMA_CHECK_UCX: UCX >= 1.13 (ucp), through pkg-config or --with-ucx=DIR.
AC_DEFUN([EMA_CHECK_UCX], [
  AC_ARG_WITH([ucx],
    [AS_HELP_STRING([--with-ucx=DIR], [UCX install prefix (default: pkg-config)])],
    [], [with_ucx=guess])
  AS_IF([test "x$with_ucx" != xguess && test "x$with_ucx" != xyes],
        [export PKG_CONFIG_PATH="$with_ucx/lib/pkgconfig:$with_ucx/lib64/pkgconfig:$PKG_CONFIG_PATH"])
  PKG_CHECK_MODULES([UCX], [ucx >= 1.13], [],
    [AC_MSG_ERROR([UCX >= 1.13 not found: install libucx-dev or pass --with-ucx=DIR])])
  ucx_version=`$PKG_CONFIG --modversion ucx`
  # Debian's ucx.pc lists only -lucs; ucp is what we use.
  UCX_LIBS="$UCX_LIBS -lucp -luct -lucs"
  # A UCX outside the system's include path (a source build, pip's libucx
  # wheel): its headers as system headers, so that -Wextra stays on our code.
  AS_IF([test "x$with_ucx" != xguess && test "x$with_ucx" != xyes],
        [UCX_LIBS="-L$with_ucx/lib -Wl,-rpath,$with_ucx/lib $UCX_LIBS"
         UCX_CFLAGS=`echo " $UCX_CFLAGS" | sed 's/ -I */ -isystem /g'`])
  AC_SUBST([UCX_CFLAGS])
  AC_SUBST([UCX_LIBS])
])
