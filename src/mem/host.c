/*
 * The host memory kind: a capacity-limited arena in host memory that stands
 * in for a GPU where there is none.  The arena is one memfd, so a peer can
 * map any segment of it into its own window with MAP_FIXED: it opens
 * /proc/<owner pid>/fd/<fd> (same user, no name in /dev/shm to leak) and maps
 * the segment's offset.
 */
#define _GNU_SOURCE
#include "mem.h"

#include "util/log.h"

#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int host_usable(void)
{
    return 1;
}

static void host_peer_fds_close(void);

/* --- how much memory this process may have -------------------------------- */

/* The number in @path ("max" and unreadable files give 0: no limit). */
static uint64_t ema_host_read_limit(const char *path)
{
    unsigned long long v = 0;
    char word[32];
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        return 0;
    }
    if (fscanf(f, "%31s", word) == 1 && isdigit((unsigned char)word[0])) {
        v = strtoull(word, NULL, 10);
    }
    fclose(f);
    return v;
}

/* The lowest limit in @file of cgroup @path under @root/@mount and of its
 * ancestors up to the root (a parent's limit binds its children too); 0
 * for none. */
static uint64_t ema_host_cgroup_walk(const char *root, const char *mount, const char *path,
                                     const char *file)
{
    char dir[2048], full[3000];
    uint64_t lowest = 0;
    snprintf(dir, sizeof(dir), "%s", path);
    for (;;) {
        size_t n = strlen(dir);
        while (n > 0 && dir[n - 1] == '/') {
            dir[--n] = '\0'; /* "/" is the root: "" */
        }
        snprintf(full, sizeof(full), "%s%s%s/%s", root, mount, dir, file);
        uint64_t v = ema_host_read_limit(full);
        if (v != 0 && (lowest == 0 || v < lowest)) {
            lowest = v;
        }
        if (n == 0) {
            return lowest;
        }
        char *slash = strrchr(dir, '/');
        if (slash == NULL) {
            dir[0] = '\0';
        } else {
            *slash = '\0';
        }
    }
}

uint64_t ema__mem_cgroup_limit(const char *self_cgroup, const char *root)
{
    char line[2048];
    uint64_t lowest = 0;
    FILE *f = fopen(self_cgroup, "r");
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        char *ctrl = strchr(line, ':'), *path;
        if (ctrl == NULL || (path = strchr(ctrl + 1, ':')) == NULL) {
            continue;
        }
        *path++ = '\0';
        path[strcspn(path, "\n")] = '\0';
        ctrl++;
        uint64_t v = 0;
        if (ctrl[0] == '\0') { /* "0::/path", cgroup v2 */
            v = ema_host_cgroup_walk(root, "", path, "memory.max");
            if (v == 0) {
                v = ema_host_cgroup_walk(root, "/unified", path, "memory.max");
            }
        } else {
            /* v1: "N:memory:/path", or memory among other controllers */
            char *tok, *save = NULL;
            for (tok = strtok_r(ctrl, ",", &save); tok != NULL; tok = strtok_r(NULL, ",", &save)) {
                if (strcmp(tok, "memory") == 0) {
                    v = ema_host_cgroup_walk(root, "/memory", path, "memory.limit_in_bytes");
                    break;
                }
            }
        }
        /* v1 says "no limit" with a huge number (2^63 rounded to pages) */
        if (v != 0 && v < ((uint64_t)1 << 62) && (lowest == 0 || v < lowest)) {
            lowest = v;
        }
    }
    fclose(f);
    return lowest;
}

size_t ema__mem_host_limit(const char **what_p)
{
    long pages = sysconf(_SC_PHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    uint64_t ram = (pages > 0 && pg > 0) ? (uint64_t)pages * (uint64_t)pg : 0;
    uint64_t cg  = ema__mem_cgroup_limit("/proc/self/cgroup", "/sys/fs/cgroup");
    const char *what = "physical memory";
    uint64_t limit = ram;
    if (cg != 0 && (limit == 0 || cg < limit)) {
        limit = cg;
        what  = "the cgroup's memory limit";
    }
    if (limit == 0) {
        limit = SIZE_MAX; /* unknown: do not refuse */
        what  = "unknown";
    }
    if (what_p != NULL) {
        *what_p = what;
    }
    return (limit > SIZE_MAX) ? SIZE_MAX : (size_t)limit;
}

size_t ema__mem_host_available(void)
{
    char line[256];
    unsigned long long kb = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f == NULL) {
        return 0;
    }
    while (fgets(line, sizeof(line), f) != NULL) {
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
            break;
        }
    }
    fclose(f);
    return (size_t)kb << 10;
}

#define EMA_HOST_HUGE (2ul << 20)
#ifndef MFD_HUGE_2MB
#define MFD_HUGE_2MB (21u << 26)
#endif

/*
 * Huge pages, where some are reserved: with 4 KiB pages, replacing a
 * populated GiB of a window (a migration's remap) makes the kernel tear down
 * 262144 page-table entries, about 40 ms on the 2-core VM against a 60 ms
 * copy; with 2 MiB pages it is 512.  A hugetlb memfd reserves its pages at
 * mmap, so a shortage shows here and the arena falls back to 4 KiB pages.
 */
static int host_arena_create_huge(ema__mem_arena_t *arena)
{
#ifdef MFD_HUGETLB
    if (!(arena->flags & EMA_MEM_ARENA_HUGEPAGES) || arena->seg_size % EMA_HOST_HUGE != 0) {
        return -1;
    }
    int fd = memfd_create("ema-arena", MFD_CLOEXEC | MFD_HUGETLB | MFD_HUGE_2MB);
    if (fd < 0) {
        ema_debug("no huge pages for the arena (memfd_create(MFD_HUGETLB): %m)");
        return -1;
    }
    /* fallocate takes the pages now, so a shortage (or a hugetlb cgroup
     * limit, where mmap would succeed and the first touch raise SIGBUS)
     * fails here and the arena falls back */
    void *base = MAP_FAILED;
    if (ftruncate(fd, (off_t)arena->capacity) == 0 &&
        fallocate(fd, 0, 0, (off_t)arena->capacity) == 0) {
        base = mmap(NULL, arena->capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (base == MAP_FAILED) {
        ema_debug("not enough huge pages for an arena of %zu bytes (%m): 4 KiB pages",
                  arena->capacity);
        close(fd);
        return -1;
    }
    arena->fd   = fd;
    arena->base = base;
    arena->huge = 1;
    return 0;
#else
    return -1;
#endif
}

static ema_status_t host_arena_create(ema__mem_arena_t *arena)
{
    if (host_arena_create_huge(arena) == 0) {
        return EMA_SUCCESS;
    }
    int fd = memfd_create("ema-arena", MFD_CLOEXEC);
    if (fd < 0) {
        ema_error("memfd_create(ema-arena) failed: %m");
        return EMA_ERR_IO;
    }
    if (ftruncate(fd, (off_t)arena->capacity) != 0) {
        ema_error("ftruncate(ema-arena, %zu) failed: %m", arena->capacity);
        close(fd);
        return EMA_ERR_NO_MEMORY;
    }
    void *base = mmap(NULL, arena->capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
        ema_error("mmap(ema-arena, %zu) failed: %m", arena->capacity);
        close(fd);
        return EMA_ERR_NO_MEMORY;
    }
    arena->fd   = fd;
    arena->base = base;
    return EMA_SUCCESS;
}

static void host_arena_destroy(ema__mem_arena_t *arena)
{
    host_peer_fds_close();
    if (arena->base != NULL) {
        munmap(arena->base, arena->capacity);
    }
    if (arena->fd >= 0) {
        close(arena->fd);
    }
}

static ema_status_t host_prefault(ema__mem_arena_t *arena, uint32_t first, uint32_t count)
{
    char *p = (char *)arena->base + (size_t)first * arena->seg_size;
    size_t len = (size_t)count * arena->seg_size;
    /* MADV_POPULATE_WRITE (Linux 5.14) faults the pages in without touching
     * data; fall back to touching one byte a page. */
#ifdef MADV_POPULATE_WRITE
    if (madvise(p, len, MADV_POPULATE_WRITE) == 0) {
        return EMA_SUCCESS;
    }
#endif
    if (arena->huge) {
        return EMA_SUCCESS; /* fallocate'd at creation: resident already */
    }
    /* An atomic add of 0, not *c = *c: segments may be lent and written
     * by a borrower already, and a plain read-then-write could put back
     * the byte it read over the borrower's store. */
    long pg = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < len; off += (size_t)pg) {
        __atomic_fetch_add((char *)(p + off), (char)0, __ATOMIC_RELAXED);
    }
    return EMA_SUCCESS;
}

static ema_status_t host_reserve(ema__mem_arena_t *arena, size_t len, void **addr_p)
{
    /* 2 MiB aligned, so that a peer's huge-page segment can be mapped at any
     * segment of it: reserve 2 MiB more and trim both ends. */
    size_t span = len + EMA_HOST_HUGE;
    char *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        ema_error("mmap(PROT_NONE, %zu) to reserve a window range failed: %m", len);
        return EMA_ERR_NO_RESOURCE;
    }
    char *addr = (char *)(((uintptr_t)raw + EMA_HOST_HUGE - 1) & ~(uintptr_t)(EMA_HOST_HUGE - 1));
    if (addr > raw) {
        munmap(raw, (size_t)(addr - raw));
    }
    if (addr + len < raw + span) {
        munmap(addr + len, (size_t)(raw + span - (addr + len)));
    }
    *addr_p = addr;
    return EMA_SUCCESS;
}

static void host_unreserve(ema__mem_arena_t *arena, void *addr, size_t len)
{
    munmap(addr, len);
}

/*
 * Peers' arena files, opened once: a borrow then costs one mmap.  Keyed by
 * (pid, fd number in that pid); closed when the process's arena goes.
 */
#define EMA_HOST_FD_CACHE 64
static struct {
    int pid, rfd, lfd;
} ema_host_fds[EMA_HOST_FD_CACHE];
static int ema_host_nfds;
static pthread_mutex_t ema_host_fd_lock = PTHREAD_MUTEX_INITIALIZER;

static int host_peer_fd(int pid, int rfd)
{
    int fd = -1;
    pthread_mutex_lock(&ema_host_fd_lock);
    for (int i = 0; i < ema_host_nfds; i++) {
        if (ema_host_fds[i].pid == pid && ema_host_fds[i].rfd == rfd) {
            fd = ema_host_fds[i].lfd;
            goto out;
        }
    }
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd/%d", pid, rfd);
    fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        ema_error("open(%s) to map a peer's memory failed: %m", path);
        goto out;
    }
    if (ema_host_nfds < EMA_HOST_FD_CACHE) {
        ema_host_fds[ema_host_nfds].pid = pid;
        ema_host_fds[ema_host_nfds].rfd = rfd;
        ema_host_fds[ema_host_nfds].lfd = fd;
        ema_host_nfds++;
    }
    /* else: leaks one descriptor per map beyond 64 peer files; not reached
     * with up to 32 peers (two tiers each) */
out:
    pthread_mutex_unlock(&ema_host_fd_lock);
    return fd;
}

static void host_peer_fds_close(void)
{
    pthread_mutex_lock(&ema_host_fd_lock);
    for (int i = 0; i < ema_host_nfds; i++) {
        close(ema_host_fds[i].lfd);
    }
    ema_host_nfds = 0;
    pthread_mutex_unlock(&ema_host_fd_lock);
}

static int64_t host_seg_handle(ema__mem_arena_t *arena, uint32_t seg)
{
    return arena->fd; /* one memfd holds every segment, at seg * seg_size */
}

static ema_status_t host_map_many(ema__mem_arena_t *arena, const ema__mem_export_t *exp,
                                  uint32_t seg, uint32_t count, int64_t handle, void *addr)
{
    int fd = arena->fd, own = (exp->pid == (int32_t)getpid());

    if (!own) {
        fd = host_peer_fd((int)exp->pid, (int)handle);
        if (fd < 0) {
            return (errno == ENOENT || errno == ESRCH) ? EMA_ERR_PEER_LOST : EMA_ERR_IO;
        }
    }
    void *p = mmap(addr, (size_t)count * exp->seg_size, PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_FIXED, fd,
                   (off_t)((uint64_t)seg * exp->seg_size));
    int err = errno;
    if (p == MAP_FAILED) {
        errno = err;
        ema_error("mmap(MAP_FIXED, segment %u of pid %d) failed: %m", seg, (int)exp->pid);
        return EMA_ERR_IO;
    }
    return EMA_SUCCESS;
}

static ema_status_t host_map(ema__mem_arena_t *arena, const ema__mem_export_t *exp,
                             uint32_t seg, int64_t handle, void *addr)
{
    return host_map_many(arena, exp, seg, 1, handle, addr);
}

static ema_status_t host_unmap(ema__mem_arena_t *arena, void *addr, size_t len)
{
    /* Put the reservation back rather than leave a hole another mmap could take. */
    void *p = mmap(addr, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
    if (p == MAP_FAILED) {
        ema_error("mmap(PROT_NONE, MAP_FIXED) over an unmapped segment failed: %m");
        return EMA_ERR_IO;
    }
    return EMA_SUCCESS;
}

static ema_status_t host_attach(const ema__mem_export_t *exp, void **addr_p)
{
    int fd = host_peer_fd((int)exp->pid, (int)exp->fd);
    if (fd < 0) {
        return (errno == ENOENT || errno == ESRCH) ? EMA_ERR_PEER_LOST : EMA_ERR_IO;
    }
    void *p = mmap(NULL, exp->capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        ema_warn("mmap of pid %d's memory (%lu bytes) failed: %m", (int)exp->pid,
                 (unsigned long)exp->capacity);
        return EMA_ERR_NO_RESOURCE;
    }
    *addr_p = p;
    return EMA_SUCCESS;
}

static void host_detach(void *addr, size_t len)
{
    munmap(addr, len);
}

static ema_status_t host_copy(ema__mem_arena_t *arena, void *dst, const void *src,
                              size_t len)
{
    memcpy(dst, src, len);
    return EMA_SUCCESS;
}

/* The queued copies of the cuda kind, done at once by the CPU: a migration
 * on the host kind without direct access (EMA_HOST_DIRECT=n) then runs the
 * same piece-by-piece path as on a GPU, so that path is tested anywhere.
 * A mark is a token with nothing left to wait for. */
static ema_status_t host_copy_wait(ema__mem_arena_t *arena)
{
    return EMA_SUCCESS;
}

static ema_status_t host_copy_mark(ema__mem_arena_t *arena, void **mark_p)
{
    *mark_p = malloc(1);
    return (*mark_p != NULL) ? EMA_SUCCESS : EMA_ERR_NO_MEMORY;
}

static ema_status_t host_copy_wait_mark(ema__mem_arena_t *arena, void *mark)
{
    free(mark);
    return EMA_SUCCESS;
}

static int host_copy_mark_done(ema__mem_arena_t *arena, void *mark)
{
    (void)arena;
    (void)mark;
    return 1; /* host copies are done when copy_start returns */
}

const ema__mem_ops_t ema__mem_host_ops = {
    .size                 = sizeof(ema__mem_ops_t),
    .name                 = "host",
    .kind                 = EMA_MEMORY_KIND_HOST,
    .default_segment_size = 2u << 20,
    .granularity          = 4096,
    .usable               = host_usable,
    .arena_create         = host_arena_create,
    .arena_destroy        = host_arena_destroy,
    .prefault             = host_prefault,
    .reserve              = host_reserve,
    .unreserve            = host_unreserve,
    .seg_handle           = host_seg_handle,
    .map                  = host_map,
    .map_many             = host_map_many,
    .unmap                = host_unmap,
    .attach               = host_attach,
    .detach               = host_detach,
    .copy                 = host_copy,
    .copy_start           = host_copy,
    .copy_wait            = host_copy_wait,
    .copy_mark            = host_copy_mark,
    .copy_wait_mark       = host_copy_wait_mark,
    .copy_mark_done       = host_copy_mark_done,
};
