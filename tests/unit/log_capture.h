/*
 * stderr captured into a file for a while, to read back what the library
 * logged; for tests/unit and tests/mpi.
 */
#ifndef EMA_TESTS_LOG_CAPTURE_H_
#define EMA_TESTS_LOG_CAPTURE_H_

#include <stdio.h>
#include <sys/types.h>
#include <unistd.h>

typedef struct {
    int fd, saved;
} ema_log_capture_t;

/* stderr goes into a new file named after @tmpl (mkstemp's); returns 0, or
 * -1 where the file could not be made (stderr unchanged then). */
static inline int ema_log_capture_begin(ema_log_capture_t *c, char *tmpl)
{
    c->fd    = mkstemp(tmpl);
    c->saved = dup(STDERR_FILENO);
    if (c->fd < 0 || c->saved < 0) {
        return -1;
    }
    unlink(tmpl);
    fflush(stderr);
    dup2(c->fd, STDERR_FILENO);
    return 0;
}

/* stderr back; what was written lands in @log (at most @max - 1 bytes and
 * a NUL) and, where @echo, on stderr too (the test's own log). */
static inline void ema_log_capture_end(ema_log_capture_t *c, char *log, size_t max, int echo)
{
    fflush(stderr);
    dup2(c->saved, STDERR_FILENO);
    close(c->saved);
    ssize_t n = pread(c->fd, log, max - 1, 0);
    log[n > 0 ? n : 0] = '\0';
    close(c->fd);
    if (echo) {
        fputs(log, stderr);
    }
}

/* The number of newlines in @s. */
static inline int ema_count_lines(const char *s)
{
    int n = 0;
    for (; *s; s++) {
        n += (*s == '\n');
    }
    return n;
}

#endif
