# EMA_CHECK_CHECK: the Check unit-test framework (>= 0.15), for `make check` only.
AC_DEFUN([EMA_CHECK_CHECK], [
  PKG_CHECK_MODULES([CHECK], [check >= 0.15], [ema_have_check=yes],
    [ema_have_check=no
     AC_MSG_WARN([Check >= 0.15 not found: the unit tests will not be built (apt install check)])])
  AM_CONDITIONAL([HAVE_CHECK], [test "x$ema_have_check" = xyes])
])
