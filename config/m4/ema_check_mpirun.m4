# EMA_CHECK_MPIRUN: an mpirun (or prterun) that serves PMIx, for the multi-rank tests.
AC_DEFUN([EMA_CHECK_MPIRUN], [
  AC_ARG_VAR([MPIRUN], [launcher for the multi-rank tests (default: mpirun, else prterun)])
  AC_PATH_PROGS([MPIRUN], [mpirun prterun], [])
  AM_CONDITIONAL([HAVE_MPIRUN], [test -n "$MPIRUN"])
])
