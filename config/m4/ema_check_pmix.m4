# EMA_CHECK_PMIX: PMIx >= 4 through pkg-config or --with-pmix=DIR.
# Debian installs the headers under a private directory that only
# `pkg-config --cflags pmix` names.
AC_DEFUN([EMA_CHECK_PMIX], [
  AC_ARG_WITH([pmix],
    [AS_HELP_STRING([--with-pmix=DIR], [PMIx install prefix (default: pkg-config)])],
    [], [with_pmix=guess])
  AS_IF([test "x$with_pmix" != xguess && test "x$with_pmix" != xyes],
        [export PKG_CONFIG_PATH="$with_pmix/lib/pkgconfig:$with_pmix/lib64/pkgconfig:$PKG_CONFIG_PATH"])
  PKG_CHECK_MODULES([PMIX], [pmix >= 4], [],
    [AC_MSG_ERROR([PMIx >= 4 not found: install libpmix-dev or pass --with-pmix=DIR])])
  pmix_version=`$PKG_CONFIG --modversion pmix`
])
