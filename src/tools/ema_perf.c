/*
 * ema_perf: put and get latency and bandwidth between two ranks, each row
 * measured side by side with raw UCX in the same run; the latency of
 * borrowing one segment from the peer (borrow); the time of a reclaim
 * against a raw copy of the same bytes (reclaim).  See ema_perf(1).
 *
 *   mpirun -n 2 ema_perf [--csv] [--op put|get|borrow|reclaim|kernel|prefetch|all]
 *                        [--min 8] [--max 64M]
 *                        [--iters N] [--warmup N] [--time S] [--ucx-thread multi|single]
 *                        [--raw-mem cudamalloc|vmm] [--timer events|wall]
 *                        [--reclaim-sizes 64M,256M,1G] [-v]
 *
 * Rank 0 is the origin, rank 1 the target.  For each op and size the origin
 * times every iteration, (one op + flush of the target's endpoint), with
 * CLOCK_MONOTONIC; on the cuda kind (--timer events) it times runs of
 * PERF_MARK_OPS iterations with CUDA events instead.  EMA and raw UCX run in alternating blocks in ABBA order
 * (E R R E E R R E ...) so machine noise and drift hit both alike; a row
 * reports the median of each.  Bandwidth is size / median latency.
 *
 * On the cuda kind put and get rows carry a third column, the copy: a
 * cudaMemcpyAsync device to device of the same bytes between two cudaMalloc
 * buffers on the origin's GPU, then cudaStreamSynchronize (the copy's op +
 * flush), always timed with CUDA events in runs as --timer events.  Its
 * blocks go between the two raw ones of each quartet (E R C C R E ...), with
 * the raw column's block sizes, iterations and warm-up; the target naps
 * meanwhile.  The origin checks (and clears) the copy's destination after
 * every block.  The copy's time does not count towards --time, so the EMA
 * and raw UCX columns get the iterations they had without it.
 *
 * The raw UCX reference is set up the way EMA sets up its own transport, so
 * that the ratio measures what EMA adds on top of UCX:
 *  - its own ucp context (RMA | AMO64 | AM, mt_workers_shared, as EMA's) and
 *    worker.  The worker is UCS_THREAD_MODE_MULTI by default because EMA's
 *    worker must be (its progress thread shares it); the worker lock is then
 *    a cost of UCX, not of EMA.  --ucx-thread single gives the unlocked worker.
 *  - the target buffer is a memfd mapped MAP_SHARED and registered with
 *    ucp_mem_map without UCP_MEM_MAP_ALLOCATE, exactly like EMA's host arena,
 *    so UCX picks the same lanes and protocols for both.
 *  - both ranks create an endpoint to the other, as EMA does.
 *  - the origin issues the op and the flush back to back and spins on
 *    ucp_worker_progress until both complete (no yield, no sleep).
 *  - UCX 1.13 may carry RMA to memory it did not allocate as active messages,
 *    which need the target to progress.  EMA's target is progressed by its
 *    progress thread.  The raw target is progressed by the target's main
 *    thread in a tight ucp_worker_progress loop for the whole of every raw
 *    block: raw UCX gets a dedicated spinning target, the best case for the
 *    reference.  During EMA blocks the raw spinner naps, so it does not take
 *    a core from EMA's progress thread.
 * Worker addresses and the rkey travel through an EMA window (put into the
 * peer's part, flush, barrier); there is no MPI and no extra PMIx.
 *
 * Control protocol, all through EMA put + flush on a small control window:
 *   1. origin: puts cmd = (seq << 8 | kind) into the target's command word.
 *   2. target: sees a new word, puts it back into the origin's ack word, then
 *        RAW:  spins on ucp_worker_progress(raw worker) until the word changes;
 *        EMA:  naps (its EMA progress thread serves EMA's RMA);
 *        DONE: leaves the row and verifies what arrived.
 *   3. origin: waits for the ack, then runs the block.
 *   (COPY, the put/get rows' copy reference on the cuda kind: the target naps
 *    as for EMA; the copy runs on the origin's GPU alone.)
 * After each row both ranks agree on a verdict (each puts ok/failed into the
 * peer's part, barrier), so a data mismatch on either side stops both.
 *
 * Data is verified for every row: for put the target checks its EMA part and
 * its raw buffer against the pattern the origin sent; for get the target
 * fills the two with different patterns and the origin checks (and clears)
 * its buffer after every block.
 *
 * Memory: unless EMA_DEVICE_MEMORY is set, ema_init gets a capacity of
 * max(1 GiB, 2 * --max) so that the target's part (--max bytes) fits.
 *
 * borrow and reclaim rows use the same CSV columns; their "ucx" columns hold
 * no reference (borrow: empty) or a memcpy of the same bytes between the two
 * ranks' arenas (reclaim).  See perf_measure_borrow and perf_measure_reclaim.
 *
 * Adding a row kind: write a measure function with the perf_measure_cb
 * signature, collective over both ranks, that fills a perf_row_t, and add it
 * to perf_ops[] (with a sizes callback if its rows are not --min..--max).
 */
#define _GNU_SOURCE
#include <ema.h>
#include <ucp/api/ucp.h>

#include "perf_gpu.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define PERF_ORIGIN 0
#define PERF_TARGET 1

/* control window layout (each rank's part) */
#define CTL_SIZE    (64u << 10)
#define CTL_CMD     0    /* target's part: command from the origin */
#define CTL_ACK     64   /* origin's part: ack from the target */
#define CTL_VERDICT 128  /* each part: the peer's verdict of the last row */
#define CTL_VALUE   192  /* each part: a value the peer sent (perf_exchange) */
#define CTL_STEP    256  /* each part: the peer's step word (borrow, reclaim) */
#define CTL_RESULT  320  /* origin's part: the target's reclaim time (double bits) */
#define CTL_XCHG    4096 /* each part: the peer's raw worker address and rkey */
#define XCHG_MAGIC  0x656d61706572ull /* "emaper" */

enum { CMD_EMA = 1, CMD_RAW = 2, CMD_DONE = 3, CMD_COPY = 4 };
/* IMPL_COPY: put and get on the cuda kind only (perf_drive) */
enum { IMPL_EMA = 0, IMPL_RAW = 1, IMPL_COPY = 2, IMPL_NUM = 3 };
enum { PERF_TIMER_AUTO = 0, PERF_TIMER_WALL, PERF_TIMER_EVENTS };

#define BLOCKS_PER_IMPL 8 /* blocks per implementation per row (even: ABBA) */
/* --timer events: ops per pair of CUDA events.  One sample is the mean of a
 * run of this many ops, so that a mark's own cost (a few microseconds of
 * cudaEventRecord, outside the interval but delaying the GPU's stamp by a
 * little) is spread thin; the row is the median over runs. */
#define PERF_MARK_OPS   16

typedef struct {
    int    csv, verbose, single;
    int    raw_vmm; /* cuda: the raw target buffer is a VMM allocation (--raw-mem vmm) */
    int    raw_mem_set; /* --raw-mem given: a cuda-kind option, refused on host */
    int    timer;   /* put/get: PERF_TIMER_*; AUTO: events on the cuda kind, else wall */
    char   ops[256];
    size_t min, max;
    long   iters;       /* -1: chosen per size */
    long   warmup;
    double time_cap;    /* seconds of timed work per row, both implementations */
    size_t reclaim_sizes[16];
    int    nreclaim;
    size_t kernel_size; /* 0: 1G on the cuda kind, 256M on host */
} perf_opts_t;

/* the exchange blob each rank puts into its peer's control part */
typedef struct {
    uint64_t magic;
    uint64_t base;      /* the raw target buffer's address (target only) */
    uint32_t addr_len;
    uint32_t rkey_len;  /* 0 on the origin */
    /* followed by the worker address, then the packed rkey */
} perf_xchg_t;

typedef struct perf {
    perf_opts_t o;
    int         rank;
    /* EMA runs on the cuda memory kind: windows, the origin's buffer and
     * the raw target buffer are device memory, written and checked by
     * kernels, and the CPU never dereferences them */
    int         gpu;

    /* EMA */
    ema_win_h   ctl_win, data_win;
    char       *ctl_base;  /* this rank's control part */
    char       *data_base; /* this rank's data part (--max bytes on the target) */
    char       *buf;       /* origin: the local source/destination buffer */
    uint64_t    seq, last_cmd, verdict_seq, step_seq;
    size_t      seg;       /* the segment size (EMA_SEGMENT_SIZE) */

    /* raw UCX */
    ucp_context_h ucx;
    ucp_worker_h  worker;
    ucp_address_t *addr;
    size_t        addr_len;
    ucp_ep_h      ep;          /* to the peer */
    int           memfd;
    char         *raw_base;    /* target: the raw buffer (--max bytes) */
    size_t        raw_len;
    ucp_mem_h     memh;
    void         *rkey_buf;
    size_t        rkey_len;
    ucp_rkey_h    rkey;        /* origin: the target's raw buffer */
    uint64_t      raddr;       /* origin: its address at the target */

    /* the put/get rows' copy reference (origin, cuda kind, put or get
     * selected): two cudaMalloc buffers of --max bytes, NULL otherwise */
    char         *copy_src, *copy_dst;

    /* samples of the current row, microseconds */
    double *samples[IMPL_NUM];
    size_t  nsamples[IMPL_NUM], cap;
    size_t  niters[IMPL_NUM];  /* ops timed (more than samples with events) */
    int     nmarks;            /* CUDA events reserved (--timer events) */
} perf_t;

typedef struct {
    double us[IMPL_NUM];  /* median latency, microseconds */
    size_t n[IMPL_NUM];   /* iterations timed */
    int    no_ref;        /* no reference: the ucx columns are empty ("-") */
    int    has_copy;      /* us[IMPL_COPY], n[IMPL_COPY] hold the copy reference */
    int    skipped;       /* the size does not fit: no row is printed */
    long   warmup;        /* untimed iterations made first (borrow) */
} perf_row_t;

/* One row: collective over both ranks; fills @row on the origin.  Returns 0,
 * or -1 after printing why (the caller stops). */
typedef int (*perf_measure_cb)(perf_t *p, int op_index, size_t size, perf_row_t *row);

/* The sizes of an op's rows; NULL: --min to --max, doubling. */
typedef int (*perf_sizes_cb)(perf_t *p, size_t *sizes, int max);

typedef struct {
    const char     *name;
    const char     *help;
    perf_measure_cb measure;
    perf_sizes_cb   sizes;
} perf_op_t;

/* ------------------------------------------------------------------------- */
/* small helpers                                                              */
/* ------------------------------------------------------------------------- */

static void perf_die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "ema_perf: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\n");
    fflush(stderr);
    exit(1); /* mpirun then terminates the peer */
}

#define EMA_CHECK(_call) do { ema_status_t s_ = (_call); if (s_ != EMA_SUCCESS) \
    perf_die("%s failed: %s", #_call, ema_strerror(s_)); } while (0)
#define UCX_CHECK(_call) do { ucs_status_t s_ = (_call); if (s_ != UCS_OK) \
    perf_die("%s failed: %s", #_call, ucs_status_string(s_)); } while (0)

static inline double perf_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* The target's main thread naps during EMA blocks.  Long naps keep it off
 * the core that EMA's progress thread needs; the phase switch that ends a
 * nap is acknowledged and never timed. */
static void perf_nap(void)
{
    struct timespec ts = {0, 200000};
    nanosleep(&ts, NULL);
}

static int perf_parse_size(const char *s, size_t *size_p)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno != 0 || end == s) {
        return -1;
    }
    switch (*end) {
    case 'k': case 'K': v <<= 10; end++; break;
    case 'm': case 'M': v <<= 20; end++; break;
    case 'g': case 'G': v <<= 30; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end != '\0') {
        return -1;
    }
    *size_p = (size_t)v;
    return 0;
}

static const char *perf_size_str(size_t size, char *s, size_t len)
{
    if (size >= (1u << 30) && size % (1u << 30) == 0) {
        snprintf(s, len, "%zuG", size >> 30);
    } else if (size >= (1u << 20) && size % (1u << 20) == 0) {
        snprintf(s, len, "%zuM", size >> 20);
    } else if (size >= (1u << 10) && size % (1u << 10) == 0) {
        snprintf(s, len, "%zuK", size >> 10);
    } else {
        snprintf(s, len, "%zu", size);
    }
    return s;
}

static int perf_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double perf_median(double *v, size_t n)
{
    if (n == 0) {
        return 0.0;
    }
    qsort(v, n, sizeof(*v), perf_cmp_double);
    return (n & 1) ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The data pattern: word k of a buffer with @salt.  Different salts give
 * different bytes everywhere, so stale data from another row or the other
 * implementation never passes a check. */
static inline uint64_t perf_word(uint64_t salt, size_t k)
{
    uint64_t x = salt + (uint64_t)k * 0x9e3779b97f4a7c15ull;
    x ^= x >> 29;
    return x | 1; /* never zero: a cleared buffer never passes */
}

static void perf_fill(void *buf, size_t len, uint64_t salt)
{
    uint64_t *w = buf;
    size_t nw = len / 8;
    for (size_t k = 0; k < nw; k++) {
        w[k] = perf_word(salt, k);
    }
    if (len % 8) {
        uint64_t last = perf_word(salt, nw);
        memcpy((char *)buf + nw * 8, &last, len % 8);
    }
}

/* Returns the first bad byte offset, or (size_t)-1 if all of @len match
 * the pattern of @salt with @add added to every word. */
static size_t perf_check(const void *buf, size_t len, uint64_t salt, uint64_t add)
{
    const uint64_t *w = buf;
    size_t nw = len / 8;
    for (size_t k = 0; k < nw; k++) {
        if (w[k] != perf_word(salt, k) + add) {
            const unsigned char *b = (const unsigned char *)&w[k];
            uint64_t exp = perf_word(salt, k) + add;
            const unsigned char *e = (const unsigned char *)&exp;
            size_t i = 0;
            while (b[i] == e[i]) i++;
            return k * 8 + i;
        }
    }
    if (len % 8) {
        uint64_t last = perf_word(salt, nw) + add;
        const unsigned char *b = (const unsigned char *)buf + nw * 8;
        for (size_t i = 0; i < len % 8; i++) {
            if (b[i] != ((const unsigned char *)&last)[i]) {
                return nw * 8 + i;
            }
        }
    }
    return (size_t)-1;
}

static uint64_t perf_salt(int op_index, size_t size, int impl)
{
    return ((uint64_t)(op_index + 1) << 56) ^ ((uint64_t)size << 8) ^
           (uint64_t)(impl + 1) * 0x51ed27ull;
}

/* Buffers and windows of either kind: the host pattern functions above, or
 * their kernels in perf_gpu.cu. */
static void perf_mem_fill(perf_t *p, void *buf, size_t len, uint64_t salt)
{
    if (!p->gpu) {
        perf_fill(buf, len, salt);
    } else if (perf_gpu_fill(buf, len, salt, 0) != 0) {
        perf_die("%s", perf_gpu_error());
    }
}

static void perf_mem_zero(perf_t *p, void *buf, size_t len)
{
    if (!p->gpu) {
        memset(buf, 0, len);
    } else if (perf_gpu_fill(buf, len, 0, 1) != 0) {
        perf_die("%s", perf_gpu_error());
    }
}

/* The first wrong byte, or (size_t)-1; @add is added to every word of the
 * pattern (after the kernel row's passes). */
static size_t perf_mem_check(perf_t *p, const void *buf, size_t len, uint64_t salt,
                             uint64_t add)
{
    size_t bad = (size_t)-1;
    if (!p->gpu) {
        return perf_check(buf, len, salt, add);
    }
    if (perf_gpu_check(buf, len, salt, add, &bad) != 0) {
        perf_die("%s", perf_gpu_error());
    }
    return bad;
}

/* Copy between host and this kind's memory, either way. */
static void perf_mem_copy(perf_t *p, void *dst, const void *src, size_t len)
{
    if (!p->gpu) {
        memcpy(dst, src, len);
    } else if (perf_gpu_copy(dst, src, len) != 0) {
        perf_die("%s", perf_gpu_error());
    }
}

/* ------------------------------------------------------------------------- */
/* control window                                                             */
/* ------------------------------------------------------------------------- */

static inline uint64_t perf_ctl_load(perf_t *p, size_t off)
{
    if (p->gpu) {
        /* device memory: read with ema_get, and not too often, since every
         * read is a copy on the GPU that the timed operations share */
        uint64_t v = 0;
        struct timespec ts = {0, 20000};
        nanosleep(&ts, NULL);
        EMA_CHECK(ema_get(p->ctl_win, p->rank, off, &v, sizeof(v)));
        return v;
    }
    return __atomic_load_n((uint64_t *)(p->ctl_base + off), __ATOMIC_ACQUIRE);
}

static void perf_ctl_put(perf_t *p, int peer, size_t off, uint64_t value)
{
    EMA_CHECK(ema_put(p->ctl_win, peer, off, &value, sizeof(value)));
    EMA_CHECK(ema_win_flush(p->ctl_win, peer));
}

/* Origin: switch the target to @kind and wait until it has switched. */
static void perf_cmd(perf_t *p, int kind)
{
    uint64_t cmd = (++p->seq << 8) | (uint64_t)kind;
    double t0 = perf_now();

    perf_ctl_put(p, PERF_TARGET, CTL_CMD, cmd);
    while (perf_ctl_load(p, CTL_ACK) != cmd) {
        ema_progress(); /* in case EMA_PROGRESS_THREAD=0 here */
        sched_yield();
        if (perf_now() - t0 > 60.0) {
            perf_die("the target did not acknowledge command %" PRIx64 " in 60 s", cmd);
        }
    }
}

/* Target: follow the origin's commands until DONE. */
static void perf_serve(perf_t *p)
{
    int state = CMD_EMA;
    unsigned naps = 0;

    for (;;) {
        uint64_t cmd = perf_ctl_load(p, CTL_CMD);
        if (cmd == p->last_cmd) {
            if (state == CMD_RAW) {
                /* the dedicated spinning target of the raw reference */
                while (perf_ctl_load(p, CTL_CMD) == p->last_cmd) {
                    ucp_worker_progress(p->worker); /* cuda_ipc needs none */
                }
            } else {
                /* EMA's progress thread serves EMA's RMA.  The occasional
                 * ema_progress() only keeps the protocol from hanging if
                 * that thread is disabled (EMA_PROGRESS_THREAD=0), which
                 * makes the EMA columns meaningless. */
                perf_nap();
                if (++naps % 64 == 0) {
                    ema_progress();
                }
            }
            continue;
        }
        p->last_cmd = cmd;
        state = (int)(cmd & 0xff);
        perf_ctl_put(p, PERF_ORIGIN, CTL_ACK, cmd);
        if (state == CMD_DONE) {
            return;
        }
    }
}

/* Both ranks: each reports whether its side of the row was right; returns
 * 1 if both were. */
static int perf_agree(perf_t *p, int ok)
{
    uint64_t v = (++p->verdict_seq << 1) | (ok ? 1u : 0u);
    perf_ctl_put(p, 1 - p->rank, CTL_VERDICT, v);
    EMA_CHECK(ema_barrier());
    uint64_t peer = perf_ctl_load(p, CTL_VERDICT);
    if ((peer >> 1) != p->verdict_seq) {
        perf_die("control protocol out of step (verdict %" PRIx64 ")", peer);
    }
    return ok && (peer & 1);
}

/* ------------------------------------------------------------------------- */
/* raw UCX                                                                    */
/* ------------------------------------------------------------------------- */

static void perf_raw_setup(perf_t *p)
{
    ucp_config_t *config;
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_worker_attr_t wattr;

    UCX_CHECK(ucp_config_read(NULL, NULL, &config));
    memset(&params, 0, sizeof(params));
    params.field_mask        = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                               UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features          = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
    params.mt_workers_shared = 1;
    params.estimated_num_eps = 2;
    ucs_status_t st = ucp_init(&params, config, &p->ucx);
    ucp_config_release(config);
    UCX_CHECK(st);

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = p->o.single ? UCS_THREAD_MODE_SINGLE : UCS_THREAD_MODE_MULTI;
    UCX_CHECK(ucp_worker_create(p->ucx, &wparams, &p->worker));
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    UCX_CHECK(ucp_worker_query(p->worker, &wattr));
    if (wattr.thread_mode != wparams.thread_mode) {
        perf_die("the raw ucp worker got thread mode %d, not %d", (int)wattr.thread_mode,
                 (int)wparams.thread_mode);
    }
    UCX_CHECK(ucp_worker_get_address(p->worker, &p->addr, &p->addr_len));

    p->memfd = -1;
    if (p->rank == PERF_TARGET && p->gpu) {
        /* device memory, as EMA's cuda arena: UCX reaches it with cuda_ipc */
        p->raw_len  = p->o.max;
        p->raw_base = p->o.raw_vmm ? perf_gpu_alloc_vmm(p->raw_len) : perf_gpu_alloc(p->raw_len);
        if (p->raw_base == NULL) {
            perf_die("raw target buffer: %s", perf_gpu_error());
        }
        perf_mem_zero(p, p->raw_base, p->raw_len);
        ucp_mem_map_params_t mp;
        memset(&mp, 0, sizeof(mp));
        mp.field_mask  = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                         UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
        mp.address     = p->raw_base;
        mp.length      = p->raw_len;
        mp.memory_type = UCS_MEMORY_TYPE_CUDA;
        UCX_CHECK(ucp_mem_map(p->ucx, &mp, &p->memh));
        UCX_CHECK(ucp_rkey_pack(p->ucx, p->memh, &p->rkey_buf, &p->rkey_len));
    } else if (p->rank == PERF_TARGET) {
        /* the same kind of memory as EMA's host arena */
        long pg    = sysconf(_SC_PAGESIZE);
        p->raw_len = (p->o.max + (size_t)pg - 1) / (size_t)pg * (size_t)pg;
        p->memfd   = memfd_create("ema-perf-raw", MFD_CLOEXEC);
        if (p->memfd < 0 || ftruncate(p->memfd, (off_t)p->raw_len) != 0) {
            perf_die("memfd_create/ftruncate(%zu) failed: %s", p->raw_len, strerror(errno));
        }
        p->raw_base = mmap(NULL, p->raw_len, PROT_READ | PROT_WRITE, MAP_SHARED, p->memfd, 0);
        if (p->raw_base == MAP_FAILED) {
            perf_die("mmap(%zu) failed: %s", p->raw_len, strerror(errno));
        }
        memset(p->raw_base, 0, p->raw_len); /* fault it in, as a row would */

        ucp_mem_map_params_t mp;
        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address    = p->raw_base;
        mp.length     = p->raw_len;
        UCX_CHECK(ucp_mem_map(p->ucx, &mp, &p->memh));
        UCX_CHECK(ucp_rkey_pack(p->ucx, p->memh, &p->rkey_buf, &p->rkey_len));
    }
}

/* Exchange worker addresses (and the target's rkey) through the control
 * window, then connect. */
static void perf_raw_connect(perf_t *p)
{
    int peer = 1 - p->rank;
    size_t len = sizeof(perf_xchg_t) + p->addr_len + p->rkey_len;

    if (len > CTL_SIZE - CTL_XCHG) {
        perf_die("raw worker address + rkey (%zu bytes) do not fit the control window", len);
    }
    char *blob = calloc(1, len);
    if (blob == NULL) {
        perf_die("out of memory");
    }
    perf_xchg_t *x = (perf_xchg_t *)blob;
    x->magic    = XCHG_MAGIC;
    x->base     = (uint64_t)(uintptr_t)p->raw_base;
    x->addr_len = (uint32_t)p->addr_len;
    x->rkey_len = (uint32_t)p->rkey_len;
    memcpy(blob + sizeof(*x), p->addr, p->addr_len);
    if (p->rkey_len) {
        memcpy(blob + sizeof(*x) + p->addr_len, p->rkey_buf, p->rkey_len);
    }
    EMA_CHECK(ema_put(p->ctl_win, peer, CTL_XCHG, blob, len));
    EMA_CHECK(ema_win_flush(p->ctl_win, peer));
    free(blob);
    EMA_CHECK(ema_barrier());

    /* read back with ema_get: on the cuda kind the part is device memory */
    const perf_xchg_t *rx = malloc(CTL_SIZE - CTL_XCHG);
    if (rx == NULL) {
        perf_die("out of memory");
    }
    EMA_CHECK(ema_get(p->ctl_win, p->rank, CTL_XCHG, (void *)rx, CTL_SIZE - CTL_XCHG));
    if (rx->magic != XCHG_MAGIC ||
        sizeof(*rx) + rx->addr_len + rx->rkey_len > CTL_SIZE - CTL_XCHG) {
        perf_die("bad raw address blob from rank %d", peer);
    }
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
    ep.address    = (const ucp_address_t *)((const char *)rx + sizeof(*rx));
    UCX_CHECK(ucp_ep_create(p->worker, &ep, &p->ep));
    if (p->rank == PERF_ORIGIN) {
        if (rx->rkey_len == 0) {
            perf_die("the target sent no rkey");
        }
        UCX_CHECK(ucp_ep_rkey_unpack(p->ep, (const char *)rx + sizeof(*rx) + rx->addr_len,
                                     &p->rkey));
        p->raddr = rx->base;
    }
    free((void *)rx);
    EMA_CHECK(ema_barrier());
}

static void perf_raw_teardown(perf_t *p)
{
    ucp_request_param_t param;

    if (p->rkey != NULL) {
        ucp_rkey_destroy(p->rkey);
    }
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags        = UCP_EP_CLOSE_FLAG_FORCE; /* as EMA: the peer may be gone */
    ucs_status_ptr_t sp = ucp_ep_close_nbx(p->ep, &param);
    if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
        while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
            ucp_worker_progress(p->worker);
        }
        ucp_request_free(sp);
    }
    if (p->memh != NULL) {
        ucp_rkey_buffer_release(p->rkey_buf);
        ucp_mem_unmap(p->ucx, p->memh);
        if (p->gpu) {
            perf_gpu_free(p->raw_base);
        } else {
            munmap(p->raw_base, p->raw_len);
            close(p->memfd);
        }
    }
    ucp_worker_release_address(p->worker, p->addr);
    ucp_worker_destroy(p->worker);
    ucp_cleanup(p->ucx);
}

static inline void perf_raw_wait(perf_t *p, ucs_status_ptr_t sp, const char *what)
{
    if (sp == NULL) {
        return;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        perf_die("%s failed: %s", what, ucs_status_string(UCS_PTR_STATUS(sp)));
    }
    ucs_status_t st;
    while ((st = ucp_request_check_status(sp)) == UCS_INPROGRESS) {
        ucp_worker_progress(p->worker);
    }
    ucp_request_free(sp);
    if (st != UCS_OK) {
        perf_die("%s failed: %s", what, ucs_status_string(st));
    }
}

/* ------------------------------------------------------------------------- */
/* one iteration of each implementation: op + flush                           */
/* ------------------------------------------------------------------------- */

typedef void (*perf_iter_cb)(perf_t *p, size_t size);

static void perf_ema_put(perf_t *p, size_t size)
{
    EMA_CHECK(ema_put(p->data_win, PERF_TARGET, 0, p->buf, size));
    EMA_CHECK(ema_win_flush(p->data_win, PERF_TARGET));
}

static void perf_ema_get(perf_t *p, size_t size)
{
    EMA_CHECK(ema_get(p->data_win, PERF_TARGET, 0, p->buf, size));
    EMA_CHECK(ema_win_flush(p->data_win, PERF_TARGET));
}

static const ucp_request_param_t perf_raw_param = {.op_attr_mask = 0};

/* The op and the flush are issued back to back and waited for together:
 * the cheapest correct way to do op + flush with UCX.  @op is the op's
 * request, @what the call that issued it. */
static void perf_raw_flush_op(perf_t *p, ucs_status_ptr_t op, const char *what)
{
    if (UCS_PTR_IS_ERR(op)) {
        perf_raw_wait(p, op, what);
    }
    ucs_status_ptr_t fl = ucp_ep_flush_nbx(p->ep, &perf_raw_param);
    perf_raw_wait(p, op, what);
    perf_raw_wait(p, fl, "ucp_ep_flush_nbx");
}

static void perf_raw_put(perf_t *p, size_t size)
{
    perf_raw_flush_op(p, ucp_put_nbx(p->ep, p->buf, size, p->raddr, p->rkey, &perf_raw_param),
                      "ucp_put_nbx");
}

static void perf_raw_get(perf_t *p, size_t size)
{
    perf_raw_flush_op(p, ucp_get_nbx(p->ep, p->buf, size, p->raddr, p->rkey, &perf_raw_param),
                      "ucp_get_nbx");
}

/* The copy reference of put and get (cuda kind): the same bytes, device to
 * device on the origin's GPU, synchronized as a flush would be. */
static void perf_copy_iter(perf_t *p, size_t size)
{
    if (perf_gpu_copy_d2d(p->copy_dst, p->copy_src, size) != 0) {
        perf_die("copy reference: %s", perf_gpu_error());
    }
}

/* ------------------------------------------------------------------------- */
/* the interleaved driver (origin)                                             */
/* ------------------------------------------------------------------------- */

typedef struct {
    /* iter[IMPL_COPY]: NULL, or perf_copy_iter (run where p->copy_src is) */
    perf_iter_cb iter[IMPL_NUM];
    /* after each EMA or raw block (untimed); returns 0 if the data is right */
    int (*after_block)(perf_t *p, int op_index, size_t size, int impl);
} perf_rma_t;

static long perf_iters_for(const perf_t *p, size_t size)
{
    if (p->o.iters > 0) {
        return p->o.iters;
    }
    /* 2000 up to 2 MiB, then fewer in proportion, at least 64 (62 at 2 MiB
     * and 32 at 64 MiB before: 8 and 4 ops per block, too few for the runs
     * of --timer events); the time cap bounds the rest */
    const size_t knee = 2u << 20;
    long n = (size <= knee) ? 2000 : (long)(2000.0 * (double)knee / (double)size);
    return n < 64 ? 64 : n;
}

static void perf_reserve_samples(perf_t *p, size_t n)
{
    if (n <= p->cap) {
        return;
    }
    for (int i = 0; i < IMPL_NUM; i++) {
        double *s = realloc(p->samples[i], n * sizeof(double));
        if (s == NULL) {
            perf_die("out of memory for %zu samples", n);
        }
        p->samples[i] = s;
    }
    p->cap = n;
}

static int perf_verify(perf_t *p, const char *what, const void *buf, size_t size,
                       uint64_t salt)
{
    size_t bad = perf_mem_check(p, buf, size, salt, 0);
    if (bad != (size_t)-1) {
        fprintf(stderr, "ema_perf: DATA MISMATCH: %s, size %zu: first wrong byte at offset %zu\n",
                what, size, bad);
        return -1;
    }
    return 0;
}

/* After each copy block: the destination holds the source's pattern; cleared
 * so that the next block must copy every byte again. */
static int perf_copy_after_block(perf_t *p, int op_index, size_t size)
{
    int rc = perf_verify(p, "copy reference, cudaMemcpy destination", p->copy_dst, size,
                         perf_salt(op_index, size, IMPL_COPY));
    perf_mem_zero(p, p->copy_dst, size);
    return rc;
}

/* The block orders, cycles that give each implementation two blocks: ABBA
 * for EMA and raw UCX; with the copy, its two blocks between the raw ones,
 * so that the EMA/raw order stays ABBA and drift hits all three alike. */
static const int perf_order2[] = {IMPL_EMA, IMPL_RAW, IMPL_RAW, IMPL_EMA};
static const int perf_order3[] = {IMPL_EMA, IMPL_RAW, IMPL_COPY, IMPL_COPY, IMPL_RAW, IMPL_EMA};

static int perf_drive(perf_t *p, int op_index, size_t size, const perf_rma_t *rma,
                      perf_row_t *row)
{
    long iters = perf_iters_for(p, size);
    long block = (iters + BLOCKS_PER_IMPL - 1) / BLOCKS_PER_IMPL;
    int capped = (p->o.iters <= 0); /* an explicit --iters is honoured exactly */
    int warm[IMPL_NUM] = {0};
    double timed = 0.0; /* EMA and raw UCX only: the copy does not shorten them */
    int copy = (rma->iter[IMPL_COPY] != NULL && p->copy_src != NULL);
    const int *order = copy ? perf_order3 : perf_order2;
    int cycle = copy ? 6 : 4;
    int nimpl = copy ? 3 : 2;

    int events = (p->o.timer == PERF_TIMER_EVENTS);
    perf_reserve_samples(p, (size_t)block * BLOCKS_PER_IMPL);
    for (int i = 0; i < IMPL_NUM; i++) {
        p->nsamples[i] = p->niters[i] = 0;
    }
    if (events || copy) { /* the copy is timed with events whatever --timer says */
        int need = 2 * (int)((block + PERF_MARK_OPS - 1) / PERF_MARK_OPS);
        if (need > p->nmarks) {
            if (perf_gpu_marks_reserve(need) != 0) {
                perf_die("CUDA events for %s: %s", events ? "--timer events" : "the copy",
                         perf_gpu_error());
            }
            p->nmarks = need;
        }
    }

    for (int b = 0; b < nimpl * BLOCKS_PER_IMPL; b++) {
        int impl = order[b % cycle];
        perf_iter_cb iter = rma->iter[impl];
        int ev = events || impl == IMPL_COPY;
        long todo = block;
        if (!capped) {
            long left = iters - (long)p->niters[impl];
            todo = left < block ? left : block;
        }
        if (todo <= 0) {
            /* an explicit --iters spent in the earlier blocks (5 as 2+2+1):
             * this block runs nothing, and has nothing to check (its buffer
             * was cleared after the last one) */
            continue;
        }

        perf_cmd(p, impl == IMPL_RAW ? CMD_RAW : impl == IMPL_COPY ? CMD_COPY : CMD_EMA);
        if (!warm[impl]) {
            double t0 = perf_now();
            for (long i = 0; i < p->o.warmup; i++) {
                iter(p, size);
                if (capped && perf_now() - t0 > p->o.time_cap / 20) {
                    break;
                }
            }
            warm[impl] = 1;
            if (impl == IMPL_COPY) {
                perf_mem_zero(p, p->copy_dst, size); /* the check sees timed copies only */
            }
        }
        double *s = p->samples[impl] + p->nsamples[impl];
        double t_block = 0.0;
        if (ev) {
            /* runs of PERF_MARK_OPS ops between two events; read after the
             * block, so that no wait on an event falls between the ops */
            long nrun = (todo + PERF_MARK_OPS - 1) / PERF_MARK_OPS;
            for (long r = 0; r < nrun; r++) {
                long k = todo - r * PERF_MARK_OPS;
                k = k < PERF_MARK_OPS ? k : PERF_MARK_OPS;
                if (perf_gpu_mark((int)(2 * r)) != 0) {
                    perf_die("cudaEventRecord: %s", perf_gpu_error());
                }
                double t0 = perf_now();
                for (long i = 0; i < k; i++) {
                    iter(p, size);
                }
                t_block += perf_now() - t0;
                if (perf_gpu_mark((int)(2 * r + 1)) != 0) {
                    perf_die("cudaEventRecord: %s", perf_gpu_error());
                }
            }
            for (long r = 0; r < nrun; r++) {
                long k = todo - r * PERF_MARK_OPS;
                k = k < PERF_MARK_OPS ? k : PERF_MARK_OPS;
                double us;
                if (perf_gpu_mark_us((int)(2 * r), (int)(2 * r + 1), &us) != 0) {
                    perf_die("cudaEventElapsedTime: %s", perf_gpu_error());
                }
                s[r] = us / (double)k;
            }
            p->nsamples[impl] += (size_t)nrun;
        } else {
            for (long i = 0; i < todo; i++) {
                double t0 = perf_now();
                iter(p, size);
                double t1 = perf_now();
                s[i] = (t1 - t0) * 1e6;
                t_block += t1 - t0;
            }
            p->nsamples[impl] += (size_t)todo;
        }
        if (impl != IMPL_COPY) {
            timed += t_block;
        }
        p->niters[impl] += (size_t)todo;
        int bad = impl == IMPL_COPY ? perf_copy_after_block(p, op_index, size) != 0
                : rma->after_block != NULL && rma->after_block(p, op_index, size, impl) != 0;
        if (bad) {
            perf_cmd(p, CMD_DONE);
            return -1;
        }
        /* stop early only after a complete cycle (ABBA quartet) */
        if (capped && (b % cycle) == cycle - 1 && timed > p->o.time_cap) {
            break;
        }
    }
    perf_cmd(p, CMD_DONE);
    for (int i = 0; i < nimpl; i++) {
        row->n[i]  = p->niters[i];
        row->us[i] = perf_median(p->samples[i], p->nsamples[i]);
    }
    row->has_copy = copy;
    return 0;
}

/* ------------------------------------------------------------------------- */
/* ops                                                                        */
/* ------------------------------------------------------------------------- */

/* Origin, before a put or get row: the copy reference's source holds a
 * pattern of its own, its destination zeros (where there is a copy). */
static void perf_copy_prepare(perf_t *p, int op_index, size_t size)
{
    if (p->copy_src != NULL) {
        perf_mem_fill(p, p->copy_src, size, perf_salt(op_index, size, IMPL_COPY));
        perf_mem_zero(p, p->copy_dst, size);
    }
}

static int perf_measure_put(perf_t *p, int op_index, size_t size, perf_row_t *row)
{
    static const perf_rma_t rma = {{perf_ema_put, perf_raw_put, perf_copy_iter}, NULL};
    uint64_t salt = perf_salt(op_index, size, IMPL_EMA);
    int ok = 1;

    if (p->rank == PERF_ORIGIN) {
        perf_mem_fill(p, p->buf, size, salt);
        perf_copy_prepare(p, op_index, size);
    } else {
        perf_mem_zero(p, p->data_base, size);
        perf_mem_zero(p, p->raw_base, size);
    }
    EMA_CHECK(ema_barrier());
    if (p->rank == PERF_ORIGIN) {
        ok = perf_drive(p, op_index, size, &rma, row) == 0;
    } else {
        perf_serve(p);
        ok = perf_verify(p, "put, EMA window at the target", p->data_base, size, salt) == 0 &&
             perf_verify(p, "put, raw UCX buffer at the target", p->raw_base, size, salt) == 0;
    }
    return perf_agree(p, ok) ? 0 : -1;
}

/* get: the origin checks every block, then clears its buffer so that the
 * next block must bring every byte again */
static int perf_get_after_block(perf_t *p, int op_index, size_t size, int impl)
{
    int rc = perf_verify(p, impl == IMPL_EMA ? "get from the EMA window" : "get from the raw UCX buffer",
                         p->buf, size, perf_salt(op_index, size, impl));
    perf_mem_zero(p, p->buf, size);
    return rc;
}

static int perf_measure_get(perf_t *p, int op_index, size_t size, perf_row_t *row)
{
    static const perf_rma_t rma = {{perf_ema_get, perf_raw_get, perf_copy_iter},
                                   perf_get_after_block};
    int ok = 1;

    if (p->rank == PERF_ORIGIN) {
        perf_mem_zero(p, p->buf, size);
        perf_copy_prepare(p, op_index, size);
    } else {
        perf_mem_fill(p, p->data_base, size, perf_salt(op_index, size, IMPL_EMA));
        perf_mem_fill(p, p->raw_base, size, perf_salt(op_index, size, IMPL_RAW));
    }
    EMA_CHECK(ema_barrier());
    if (p->rank == PERF_ORIGIN) {
        ok = perf_drive(p, op_index, size, &rma, row) == 0;
    } else {
        perf_serve(p);
    }
    return perf_agree(p, ok) ? 0 : -1;
}

/* ------------------------------------------------------------------------- */
/* elastic ops: borrow and reclaim                                            */
/* ------------------------------------------------------------------------- */

/* Both ranks: send @mine to the peer, return the peer's value. */
static uint64_t perf_exchange(perf_t *p, uint64_t mine)
{
    perf_ctl_put(p, 1 - p->rank, CTL_VALUE, mine);
    EMA_CHECK(ema_barrier());
    uint64_t v = perf_ctl_load(p, CTL_VALUE);
    EMA_CHECK(ema_barrier()); /* the next exchange may not overwrite it before it is read */
    return v;
}

/* Step words: (seq << 1) | abort, put into the peer's CTL_STEP. */
static void perf_step_send(perf_t *p, uint64_t seq, int abort_)
{
    perf_ctl_put(p, 1 - p->rank, CTL_STEP, (seq << 1) | (abort_ ? 1u : 0u));
}

/* Wait, napping (the cores belong to the EMA progress threads meanwhile),
 * for the peer's step @seq; returns 1 if the peer aborted. */
static int perf_step_wait(perf_t *p, uint64_t seq)
{
    double t0 = perf_now();
    unsigned naps = 0;
    for (;;) {
        uint64_t v = perf_ctl_load(p, CTL_STEP);
        if ((v >> 1) == seq) {
            return (int)(v & 1);
        }
        perf_nap();
        if (++naps % 64 == 0) {
            ema_progress(); /* in case EMA_PROGRESS_THREAD=0 */
            if (perf_now() - t0 > 300.0) {
                perf_die("rank %d did not reach step %" PRIu64 " in 300 s", 1 - p->rank, seq);
            }
        }
    }
}

static size_t perf_round_seg(const perf_t *p, size_t n)
{
    return (n + p->seg - 1) / p->seg * p->seg;
}

static int perf_sizes_borrow(perf_t *p, size_t *sizes, int max)
{
    (void)max;
    sizes[0] = p->seg;
    return 1;
}

static int perf_sizes_reclaim(perf_t *p, size_t *sizes, int max)
{
    int n = p->o.nreclaim < max ? p->o.nreclaim : max;
    for (int i = 0; i < n; i++) {
        sizes[i] = perf_round_seg(p, p->o.reclaim_sizes[i]);
    }
    return n;
}

/* What a rank can give to a peer now: free memory beyond its lending reserve. */
static size_t perf_lendable(void)
{
    ema_mem_stat_t ms = {0};
    EMA_CHECK(ema_mem_stat(&ms));
    return ms.bytes_free > ms.reserve ? ms.bytes_free - ms.reserve : 0;
}

static size_t perf_free(void)
{
    ema_mem_stat_t ms = {0};
    EMA_CHECK(ema_mem_stat(&ms));
    return ms.bytes_free;
}

/*
 * Before the first borrow or reclaim row: make every rank's free memory
 * resident.  Each rank's arena is faulted in by its progress thread in the
 * background after ema_init (8 segments a step); until that is done a
 * borrow or a migration waits behind those steps and a first touch costs
 * milliseconds per segment.  A window of all the free memory, written once,
 * faults it in now, from the main thread.
 */
static void perf_settle(perf_t *p)
{
    static int settled;
    ema_win_h w;
    char *b;

    if (settled) {
        return;
    }
    settled = 1;
    double t0 = perf_now();
    size_t len = perf_free();
    EMA_CHECK(ema_win_allocate(len, NULL, (void **)&b, &w));
    perf_mem_zero(p, b, len);
    EMA_CHECK(ema_barrier());
    EMA_CHECK(ema_win_free(w));
    if (p->rank == PERF_ORIGIN && p->o.verbose) {
        fprintf(stderr, "ema_perf: wrote all free memory (%zu bytes on rank 0) in %.2f s\n",
                len, perf_now() - t0);
    }
}

static void perf_note(perf_t *p, const char *fmt, ...)
{
    va_list ap;
    FILE *f = p->o.csv ? stderr : stdout; /* the CSV stays CSV */
    fprintf(f, p->o.csv ? "ema_perf: " : "# ");
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fprintf(f, "\n");
    fflush(f);
}

/*
 * borrow: rank 0's window fills all of its own memory, so growing it by one
 * segment must borrow from rank 1.  Each iteration times ema_win_grow(size +
 * seg), then (untimed) checks the new segment is borrowed, writes and reads
 * back a word at its start and its end through the base pointer, and shrinks
 * back.  Rank 1 naps meanwhile; its progress thread answers the borrows.
 */
static int perf_measure_borrow(perf_t *p, int op_index, size_t size, perf_row_t *row)
{
    const size_t seg = p->seg;
    ema_win_h win;
    char *base;
    int ok = 1, abort_ = 0;

    row->no_ref = 1;
    perf_settle(p);
    uint64_t peer = perf_exchange(p, p->rank == PERF_ORIGIN ? perf_free() : perf_lendable());
    size_t lender_free = p->rank == PERF_ORIGIN ? (size_t)peer : perf_lendable();
    if (lender_free < seg) {
        if (p->rank == PERF_ORIGIN) {
            perf_note(p, "borrow skipped: rank 1 has %zu bytes to lend, one segment is %zu",
                      lender_free, seg);
        }
        row->skipped = 1;
        return perf_agree(p, 1) ? 0 : -1;
    }

    /* rank 0: a window of all its free memory, room to grow */
    size_t full = p->rank == PERF_ORIGIN ? perf_free() : 0;
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE,
                           .max_size = full + 4 * seg};
    EMA_CHECK(ema_win_allocate(full, &wp, (void **)&base, &win));
    EMA_CHECK(ema_barrier());

    if (p->rank == PERF_ORIGIN) {
        if (perf_free() != 0) {
            fprintf(stderr, "ema_perf: borrow: rank 0 still has %zu bytes free after a "
                    "window of %zu bytes\n", perf_free(), full);
            ok = 0;
        }
        long warm  = p->o.warmup;
        long iters = p->o.iters > 0 ? p->o.iters : 1000;
        double wall = perf_now();
        perf_reserve_samples(p, (size_t)iters);
        size_t n = 0;
        for (long i = -warm; i < iters && ok; i++) {
            double t0 = perf_now();
            ema_status_t st = ema_win_grow(win, full + seg);
            double t1 = perf_now();
            if (st != EMA_SUCCESS) {
                fprintf(stderr, "ema_perf: borrow: ema_win_grow(%zu) failed: %s\n", full + seg,
                        ema_strerror(st));
                ok = 0;
                break;
            }
            ema_win_stat_t ws = {0};
            EMA_CHECK(ema_win_stat(win, &ws));
            if (ws.bytes_borrowed != seg || ws.size != full + seg) {
                fprintf(stderr, "ema_perf: borrow: after the grow the window has %zu bytes, "
                        "%zu borrowed (expected %zu, %zu)\n", ws.size, ws.bytes_borrowed,
                        full + seg, seg);
                ok = 0;
                break;
            }
            uint64_t salt = perf_salt(op_index, size, (int)(i & 0xffff));
            uint64_t w[2] = {perf_word(salt, 0), perf_word(salt, 1)}, r[2] = {0, 0};
            perf_mem_copy(p, base + full, &w[0], 8);
            perf_mem_copy(p, base + full + seg - 8, &w[1], 8);
            perf_mem_copy(p, &r[0], base + full, 8);
            perf_mem_copy(p, &r[1], base + full + seg - 8, 8);
            if (r[0] != w[0] || r[1] != w[1]) {
                fprintf(stderr, "ema_perf: DATA MISMATCH: borrow, the new segment does not "
                        "keep what was written\n");
                ok = 0;
                break;
            }
            EMA_CHECK(ema_win_shrink(win, full));
            if (i >= 0) {
                p->samples[IMPL_EMA][n++] = (t1 - t0) * 1e6;
            }
            /* an explicit --iters is honoured; else stop after 5 s */
            if (p->o.iters <= 0 && i >= 50 && perf_now() - wall > 5.0) {
                break;
            }
        }
        abort_ = !ok;
        row->n[IMPL_EMA]  = n;
        row->warmup       = warm;
        if (n > 0) {
            double *s = p->samples[IMPL_EMA];
            row->us[IMPL_EMA] = perf_median(s, n); /* sorts s */
            if (!p->o.csv) {
                printf("# borrow: %ld warm-up grows, %zu timed: min %.1f, p10 %.1f, median "
                       "%.1f, p90 %.1f, p99 %.1f, max %.1f us\n", warm, n, s[0], s[n / 10],
                       row->us[IMPL_EMA], s[n * 9 / 10], s[n * 99 / 100], s[n - 1]);
            } else if (p->o.verbose) {
                fprintf(stderr, "ema_perf: borrow: %ld warm-up grows, %zu timed\n", warm, n);
            }
        }
        perf_step_send(p, ++p->step_seq, abort_);
    } else {
        perf_step_wait(p, ++p->step_seq);
    }
    EMA_CHECK(ema_barrier());
    EMA_CHECK(ema_win_free(win));
    return perf_agree(p, ok) ? 0 : -1;
}

/* reclaim, prefetch: collective; whether n bytes fit (rank 0 keeps n free,
 * rank 1 lends n).  Returns 1 if they do, with rank 0's free and rank 1's
 * lendable bytes; else notes why (rank 0) and returns 0: the row is skipped. */
static int perf_move_fits(perf_t *p, const char *what, size_t n, size_t *f0_p, size_t *f1_p)
{
    char s[32];

    perf_settle(p);
    uint64_t mine = p->rank == PERF_ORIGIN ? perf_free() : perf_lendable();
    uint64_t peer = perf_exchange(p, mine);
    *f0_p = p->rank == PERF_ORIGIN ? mine : peer; /* rank 0: free */
    *f1_p = p->rank == PERF_ORIGIN ? peer : mine; /* rank 1: lendable */
    if (*f0_p >= n && *f1_p >= n) {
        return 1;
    }
    if (p->rank == PERF_ORIGIN) {
        perf_note(p, "%s %s skipped: it does not fit (rank 0 has %zu bytes free, rank 1 %zu "
                  "lendable; each needs %zu; raise EMA_DEVICE_MEMORY)", what,
                  perf_size_str(n, s, sizeof(s)), *f0_p, *f1_p, n);
    }
    return 0;
}

/* reclaim, prefetch, rank 0: window C holds n bytes all borrowed and rank 0
 * has no free memory left; writes the pattern of @salt into C and returns
 * the reference, a timed copy of C (rank 1's memory) into @tail (rank 0's,
 * resident); -1 (after saying why) if the setup is not as it should be. */
static double perf_move_setup(perf_t *p, const char *what, ema_win_h wc, char *c, char *tail,
                              size_t n, uint64_t salt)
{
    ema_win_stat_t ws = {0};
    double us;

    perf_mem_zero(p, tail, n); /* resident and mapped */
    EMA_CHECK(ema_win_stat(wc, &ws));
    if (ws.bytes_borrowed != n || perf_free() != 0) {
        fprintf(stderr, "ema_perf: %s: setup: C has %zu of %zu bytes borrowed, rank 0 %zu "
                "bytes free (expected 0)\n", what, ws.bytes_borrowed, n, perf_free());
        return -1;
    }
    perf_mem_fill(p, c, n, salt);
    if (p->gpu) {
        /* cudaMemcpy device to device, timed with CUDA events */
        if (perf_gpu_memcpy_us(tail, c, n, &us) != 0) {
            perf_die("%s", perf_gpu_error());
        }
    } else {
        double t0 = perf_now();
        memcpy(tail, c, n);
        us = (perf_now() - t0) * 1e6;
    }
    return us;
}

/* reclaim, prefetch: repetitions of a size.  On the GPU a repetition of a
 * GiB takes milliseconds, and 7 keep one slow launch-time repetition (the
 * first, which imports the lender's memory) out of the median; on host
 * memory one of a GiB takes seconds on a small machine. */
static int perf_move_reps(const perf_t *p, size_t n)
{
    return p->gpu ? 7 : (n >= (1ul << 30) ? 3 : 5);
}

/* reclaim, prefetch, rank 0: the row's medians of @r repetitions, the copy
 * reference's (samples[IMPL_RAW]) and @what's (samples[IMPL_EMA]); with
 * --verbose, each repetition's figures too.  None where @r is 0. */
static void perf_move_medians(perf_t *p, const char *what, size_t n, int r, perf_row_t *row)
{
    if (r <= 0) {
        return;
    }
    if (p->o.verbose) {
        for (int i = 0; i < r; i++) {
            fprintf(stderr, "ema_perf: %s %zu, repetition %d: copy %.0f us, %s %.0f us\n", what,
                    n, i, p->samples[IMPL_RAW][i], what, p->samples[IMPL_EMA][i]);
        }
    }
    row->us[IMPL_EMA] = perf_median(p->samples[IMPL_EMA], (size_t)r);
    row->us[IMPL_RAW] = perf_median(p->samples[IMPL_RAW], (size_t)r);
}

/*
 * reclaim of N bytes (rank 1 the lender, rank 0 the borrower):
 *  - rank 0: window B of all its free memory (its last N bytes touched),
 *    window C grown by N bytes, which must come from rank 1; rank 1: a window
 *    that leaves exactly N bytes lendable, so that its reclaim must recall
 *    all of C.
 *  - each repetition: rank 0 writes a pattern into C, times the copy
 *    reference (memcpy of C, rank 1's memory, into B's last N bytes, rank 0's
 *    memory; both mapped and resident), then shrinks B by N: the memory it
 *    just copied into is now free, the migration target.  Rank 1 times
 *    ema_reclaim; rank 0 naps meanwhile (its progress thread migrates), then
 *    checks C is all local and holds the pattern, and restores the setup.
 */
static int perf_measure_reclaim(perf_t *p, int op_index, size_t size, perf_row_t *row)
{
    const size_t n = size; /* rounded to segments by perf_sizes_reclaim */
    const uint64_t timeout_ms = 120000;
    ema_win_h wb, wc;
    char *b, *c;
    int ok = 1, abort_ = 0;
    size_t f0, f1;

    if (!perf_move_fits(p, "reclaim", n, &f0, &f1)) {
        row->skipped = 1;
        return perf_agree(p, 1) ? 0 : -1;
    }

    size_t bsize = p->rank == PERF_ORIGIN ? f0 : f1 - n;
    EMA_CHECK(ema_win_allocate(bsize, NULL, (void **)&b, &wb));
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE,
                           .max_size = p->rank == PERF_ORIGIN ? n : 0};
    EMA_CHECK(ema_win_allocate(0, &wp, (void **)&c, &wc));
    EMA_CHECK(ema_barrier());

    int reps = perf_move_reps(p, n);
    perf_reserve_samples(p, (size_t)reps);
    char *tail = b + bsize - n; /* rank 0: the copy destination, then the migration target */
    int r;
    for (r = 0; r < reps && !abort_; r++) {
        uint64_t seq = ++p->step_seq;
        if (p->rank == PERF_ORIGIN) {
            ema_win_stat_t ws = {0};
            if (r == 0) {
                EMA_CHECK(ema_win_grow(wc, n));
            }
            uint64_t salt = perf_salt(op_index, n, r);
            p->samples[IMPL_RAW][r] = perf_move_setup(p, "reclaim", wc, c, tail, n, salt);
            if (p->samples[IMPL_RAW][r] < 0) {
                ok = 0;
            }

            EMA_CHECK(ema_win_shrink(wb, bsize - n));
            if (perf_free() != n) {
                fprintf(stderr, "ema_perf: reclaim: rank 0 has %zu bytes free, not %zu\n",
                        perf_free(), n);
                ok = 0;
            }
            perf_step_send(p, seq, !ok); /* go, or stop */
            if (!ok) {
                break;
            }
            if (perf_step_wait(p, seq)) {
                ok = 0; /* the reclaim failed: rank 1 said why, and stops */
                break;
            }
            double us;
            uint64_t bits = perf_ctl_load(p, CTL_RESULT);
            memcpy(&us, &bits, sizeof(us));
            p->samples[IMPL_EMA][r] = us;

            EMA_CHECK(ema_win_stat(wc, &ws));
            if (ok && (ws.bytes_borrowed != 0 || ws.bytes_local != n || ws.bytes_spilled != 0)) {
                fprintf(stderr, "ema_perf: reclaim %zu: afterwards C has %zu bytes local, %zu "
                        "borrowed, %zu spilled (expected all local)\n", n, ws.bytes_local,
                        ws.bytes_borrowed, ws.bytes_spilled);
                ok = 0;
            }
            if (ok && perf_verify(p, "reclaim, window C after the migration", c, n, salt) != 0) {
                ok = 0;
            }
            if (ok && r + 1 < reps) {
                /* back to the setup: C's memory (now rank 0's) goes to B,
                 * then C borrows again from rank 1, which has released */
                EMA_CHECK(ema_win_shrink(wc, 0));
                EMA_CHECK(ema_win_grow(wb, bsize));
                EMA_CHECK(ema_win_grow(wc, n));
            }
            if (!ok && r + 1 < reps) {
                perf_step_send(p, ++p->step_seq, 1); /* rank 1 waits for the next go */
            }
            abort_ = !ok;
        } else {
            if (perf_step_wait(p, seq)) {
                abort_ = 1;
                break;
            }
            /* free memory (the reserve included) counts first: free + N
             * recalls exactly the N bytes lent */
            size_t have = perf_free();
            double t0 = perf_now();
            ema_status_t st = ema_reclaim(have + n, timeout_ms);
            double t1 = perf_now();
            double us = (t1 - t0) * 1e6;
            if (st != EMA_SUCCESS) {
                fprintf(stderr, "ema_perf: reclaim: ema_reclaim(%zu, %" PRIu64 " ms) failed after "
                        "%.0f us: %s\n", have + n, timeout_ms, us, ema_strerror(st));
                ok = 0;
            } else if (p->o.verbose) {
                ema_mem_stat_t ms = {0};
                EMA_CHECK(ema_mem_stat(&ms));
                fprintf(stderr, "ema_perf: reclaim %zu: %.0f us here, %.0f us inside the "
                        "library, %zu bytes lent now\n", n, us, ms.reclaim_last_us,
                        ms.bytes_lent);
            }
            if (st == EMA_SUCCESS || st == EMA_ERR_TIMEOUT) {
                EMA_CHECK(ema_reclaim_release(have + n));
            }
            uint64_t bits;
            memcpy(&bits, &us, sizeof(bits));
            perf_ctl_put(p, PERF_ORIGIN, CTL_RESULT, bits);
            perf_step_send(p, seq, !ok);
            abort_ = !ok;
        }
    }
    row->n[IMPL_EMA] = row->n[IMPL_RAW] = (size_t)r;
    if (p->rank == PERF_ORIGIN) {
        perf_move_medians(p, "reclaim", n, r, row);
    }
    EMA_CHECK(ema_barrier());
    EMA_CHECK(ema_win_free(wc));
    EMA_CHECK(ema_win_free(wb));
    return perf_agree(p, ok) ? 0 : -1;
}

/*
 * kernel: compute over a window half of whose memory is borrowed, against
 * the same compute over an all-local window (the reference).  Rank 0 makes
 * window L (size bytes, local), window H (size/2 local), a ballast window
 * of the rest of its free memory, then grows H to size: the second half is
 * borrowed from rank 1.  One pass reads and writes every 8-byte word (+1):
 * a CUDA kernel timed with CUDA events on the cuda kind, a CPU loop timed
 * with the wall clock on host.  Passes over L and H alternate; afterwards
 * both windows are checked against the pattern plus the passes made.
 * ema_us = median pass over H, ucx columns = median pass over L, ratio =
 * L / H (1.0: borrowed pages as fast as local ones).
 */
static double perf_pass(perf_t *p, char *w, size_t len, int passes)
{
    double us = 0;
    if (p->gpu) {
        if (perf_gpu_passes_us(w, len, passes, &us) != 0) {
            perf_die("%s", perf_gpu_error());
        }
        return us / passes;
    }
    double t0 = perf_now();
    for (int i = 0; i < passes; i++) {
        uint64_t *x = (uint64_t *)w;
        for (size_t k = 0; k < len / 8; k++) {
            x[k] += 1;
        }
        __asm__ __volatile__("" ::: "memory");
    }
    return (perf_now() - t0) * 1e6 / passes;
}

static int perf_sizes_kernel(perf_t *p, size_t *sizes, int max)
{
    (void)max;
    size_t s = p->o.kernel_size ? p->o.kernel_size : (p->gpu ? (1ul << 30) : (256ul << 20));
    s = perf_round_seg(p, s);
    sizes[0] = (s / p->seg) % 2 ? s + p->seg : s; /* an even number of segments */
    return 1;
}

static int perf_measure_kernel(perf_t *p, int op_index, size_t size, perf_row_t *row)
{
    const size_t half = size / 2;
    const int reps = 7, passes = p->gpu ? 10 : 2;
    ema_win_h wl, wh, wx;
    char *l, *h, *x;
    int ok = 1;
    char s[32];

    perf_settle(p);
    uint64_t mine = p->rank == PERF_ORIGIN ? perf_free() : perf_lendable();
    uint64_t peer = perf_exchange(p, mine);
    size_t f0 = p->rank == PERF_ORIGIN ? mine : peer;
    size_t f1 = p->rank == PERF_ORIGIN ? peer : mine;
    if (f0 < size + half || f1 < half) {
        if (p->rank == PERF_ORIGIN) {
            perf_note(p, "kernel %s skipped: rank 0 needs %zu bytes free (has %zu), rank 1 "
                      "%zu lendable (has %zu); raise EMA_DEVICE_MEMORY or lower --kernel-size",
                      perf_size_str(size, s, sizeof(s)), size + half, f0, half, f1);
        }
        row->skipped = 1;
        return perf_agree(p, 1) ? 0 : -1;
    }
    int o = p->rank == PERF_ORIGIN;
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE, .max_size = size};
    EMA_CHECK(ema_win_allocate(o ? size : 0, NULL, (void **)&l, &wl));
    EMA_CHECK(ema_win_allocate(o ? half : 0, &wp, (void **)&h, &wh));
    EMA_CHECK(ema_win_allocate(o ? perf_free() : 0, NULL, (void **)&x, &wx));
    if (o) {
        ema_win_stat_t ws = {0};
        EMA_CHECK(ema_win_grow(wh, size));
        EMA_CHECK(ema_win_stat(wh, &ws));
        if (ws.bytes_borrowed != half) {
            fprintf(stderr, "ema_perf: kernel: window H has %zu of %zu bytes borrowed, not "
                    "half\n", ws.bytes_borrowed, size);
            ok = 0;
        }
        uint64_t salt = perf_salt(op_index, size, 0);
        perf_mem_fill(p, l, size, salt);
        perf_mem_fill(p, h, size, salt);
        perf_pass(p, l, size, 1); /* warm-up: each window once */
        perf_pass(p, h, size, 1);
        perf_reserve_samples(p, (size_t)reps);
        for (int r = 0; r < reps && ok; r++) { /* ABBA */
            int hf = r % 2;
            p->samples[IMPL_EMA][r] = perf_pass(p, hf ? h : l, size, passes);
            p->samples[IMPL_RAW][r] = perf_pass(p, hf ? l : h, size, passes);
            if (!hf) {
                double t = p->samples[IMPL_EMA][r];
                p->samples[IMPL_EMA][r] = p->samples[IMPL_RAW][r];
                p->samples[IMPL_RAW][r] = t;
            }
        }
        uint64_t total = 1 + (uint64_t)reps * (uint64_t)passes;
        if (ok && (perf_mem_check(p, l, size, salt, total) != (size_t)-1 ||
                   perf_mem_check(p, h, size, salt, total) != (size_t)-1)) {
            fprintf(stderr, "ema_perf: DATA MISMATCH: kernel: a window does not hold the "
                    "pattern plus %" PRIu64 " after the passes\n", total);
            ok = 0;
        }
        row->n[IMPL_EMA] = row->n[IMPL_RAW] = ok ? (size_t)reps : 0;
        row->us[IMPL_EMA] = perf_median(p->samples[IMPL_EMA], row->n[IMPL_EMA]);
        row->us[IMPL_RAW] = perf_median(p->samples[IMPL_RAW], row->n[IMPL_RAW]);
    }
    EMA_CHECK(ema_barrier());
    EMA_CHECK(ema_win_free(wx));
    EMA_CHECK(ema_win_free(wh));
    EMA_CHECK(ema_win_free(wl));
    return perf_agree(p, ok) ? 0 : -1;
}

/*
 * prefetch: rank 0's window C of n bytes is all borrowed from rank 1; rank 0
 * frees n bytes of its own (shrinking B) and times ema_win_prefetch(C) until
 * ema_win_stat shows C all local: the migration alone, with no lender in the
 * loop.  The reference is the reclaim row's: a copy of n bytes from rank 1's
 * memory to rank 0's, same run.  Rank 1 only lends.
 */
static int perf_measure_prefetch(perf_t *p, int op_index, size_t size, perf_row_t *row)
{
    const size_t n = size; /* rounded to segments by perf_sizes_reclaim */
    ema_win_h wb, wc;
    char *b, *c;
    int ok = 1;
    size_t f0, f1;

    if (!perf_move_fits(p, "prefetch", n, &f0, &f1)) {
        row->skipped = 1;
        return perf_agree(p, 1) ? 0 : -1;
    }

    /* rank 0: B takes all its free memory, C borrows n from rank 1 */
    size_t bsize = p->rank == PERF_ORIGIN ? f0 : 0;
    EMA_CHECK(ema_win_allocate(bsize, NULL, (void **)&b, &wb));
    ema_win_params_t wp = {.field_mask = EMA_WIN_PARAM_FIELD_MAX_SIZE,
                           .max_size = p->rank == PERF_ORIGIN ? n : 0};
    EMA_CHECK(ema_win_allocate(0, &wp, (void **)&c, &wc));
    EMA_CHECK(ema_barrier());

    int reps = perf_move_reps(p, n), r = 0;
    if (p->rank == PERF_ORIGIN) {
        char *tail = b + bsize - n; /* the copy's destination */
        perf_reserve_samples(p, (size_t)reps);
        for (r = 0; r < reps && ok; r++) {
            ema_win_stat_t ws = {0};
            EMA_CHECK(ema_win_grow(wc, n));
            uint64_t salt = perf_salt(op_index, n, r);
            p->samples[IMPL_RAW][r] = perf_move_setup(p, "prefetch", wc, c, tail, n, salt);
            if (p->samples[IMPL_RAW][r] < 0) {
                ok = 0;
                break;
            }
            EMA_CHECK(ema_win_shrink(wb, bsize - n)); /* n bytes of room */

            double t0 = perf_now();
            EMA_CHECK(ema_win_prefetch(wc, 0, n));
            do {
                EMA_CHECK(ema_win_stat(wc, &ws));
            } while (ws.bytes_local != n && perf_now() - t0 < 60.0);
            double t1 = perf_now();
            p->samples[IMPL_EMA][r] = (t1 - t0) * 1e6;
            if (ws.bytes_local != n) {
                fprintf(stderr, "ema_perf: prefetch %zu: after 60 s C has %zu bytes local, %zu "
                        "borrowed (expected all local)\n", n, ws.bytes_local, ws.bytes_borrowed);
                ok = 0;
            }
            if (ok && perf_verify(p, "prefetch, window C after the migration", c, n, salt) != 0) {
                ok = 0;
            }
            /* back to the setup: C's memory goes to B, C borrows again */
            EMA_CHECK(ema_win_shrink(wc, 0));
            EMA_CHECK(ema_win_grow(wb, bsize));
        }
        row->n[IMPL_EMA] = row->n[IMPL_RAW] = (size_t)r;
        perf_move_medians(p, "prefetch", n, r, row);
    }
    EMA_CHECK(ema_barrier()); /* rank 1 lends and progresses meanwhile */
    EMA_CHECK(ema_win_free(wc));
    EMA_CHECK(ema_win_free(wb));
    return perf_agree(p, ok) ? 0 : -1;
}

static const perf_op_t perf_ops[] = {
    {"put", "ema_put + ema_win_flush vs ucp_put_nbx + ucp_ep_flush_nbx", perf_measure_put,
     NULL},
    {"get", "ema_get + ema_win_flush vs ucp_get_nbx + ucp_ep_flush_nbx", perf_measure_get,
     NULL},
    {"borrow", "ema_win_grow by one segment from the peer; no reference", perf_measure_borrow,
     perf_sizes_borrow},
    {"reclaim", "ema_reclaim of N bytes vs a memcpy of N bytes between the arenas",
     perf_measure_reclaim, perf_sizes_reclaim},
    {"kernel", "a pass over a half-borrowed window vs over an all-local one",
     perf_measure_kernel, perf_sizes_kernel},
    {"prefetch", "ema_win_prefetch of N borrowed bytes vs a memcpy of N bytes",
     perf_measure_prefetch, perf_sizes_reclaim},
};
#define PERF_NOPS ((int)(sizeof(perf_ops) / sizeof(perf_ops[0])))
#define PERF_OP_RECLAIM 3 /* perf_ops[] index */
#define PERF_OP_KERNEL  4
#define PERF_OP_PREFETCH 5

/* ------------------------------------------------------------------------- */
/* main                                                                       */
/* ------------------------------------------------------------------------- */

static void perf_usage(FILE *f)
{
    fprintf(f,
        "usage: mpirun -n 2 ema_perf [options]\n"
        "Put and get latency and bandwidth between rank 0 (origin) and rank 1 (target),\n"
        "each row measured side by side with raw UCX on the same transport; the latency\n"
        "of borrowing one segment; the time of a reclaim against a raw copy.\n"
        "  --csv              print op,size,ema_us,ema_GBps,ucx_us,ucx_GBps,ratio,\n"
        "                     copy_us,copy_GBps,copy_ratio\n"
        "  --op NAME          put, get, borrow, reclaim, kernel, prefetch or all\n"
        "                     (default all: every one);\n"
        "                     a comma list also works\n"
        "  --min SIZE         smallest size (default 8); K, M, G suffixes\n"
        "  --max SIZE         largest size (default 64M); sizes double from --min\n"
        "  --iters N          timed iterations per size and implementation\n"
        "                     (default: 2000 up to 2M, fewer above, capped by --time)\n"
        "  --warmup N         untimed iterations per size and implementation (default 10)\n"
        "  --time S           seconds of timed work per row when --iters is not given\n"
        "                     (default 0.25)\n"
        "  --ucx-thread MODE  raw UCX worker thread mode: multi (default, as EMA's\n"
        "                     worker) or single\n"
        "  --raw-mem KIND     cuda kind: the raw UCX target buffer, cudamalloc (default)\n"
        "                     or vmm (one cuMemCreate allocation, as EMA's segments)\n"
        "  --timer KIND       put and get: events (CUDA events around runs of 16 ops,\n"
        "                     fewer when an ABBA block is shorter: --iters / 8,\n"
        "                     the default on the cuda kind; cuda kind only) or wall\n"
        "                     (the wall clock around each op, the default on host)\n"
        "  --reclaim-sizes L  reclaim and prefetch sizes, a comma list (default\n"
        "                     64M,256M,1G); sizes\n"
        "                     that do not fit are skipped with a note\n"
        "  --kernel-size S    the window of the kernel row (default 1G on the cuda\n"
        "                     kind, 256M on host)\n"
        "  -v, --verbose      also print the transports and lanes in use\n"
        "  -h, --help         this help\n"
        "Columns: median latency of one op + flush in microseconds, GB/s = size /\n"
        "median latency (1 GB = 1e9 bytes), ratio = ucx_us / ema_us: above 1 EMA is\n"
        "faster than raw UCX, below 1 it is slower.\n"
        "copy_us, copy_GBps, copy_ratio (put and get on the cuda kind; empty in the CSV\n"
        "  otherwise, absent from the table on host): a cudaMemcpyAsync device to device\n"
        "  of the same bytes between two cudaMalloc buffers on rank 0's GPU, then\n"
        "  cudaStreamSynchronize, with the ucx columns' iterations and warm-up, timed with\n"
        "  CUDA events in runs of 16 whatever --timer says; copy_ratio = copy_us / ema_us\n"
        "  (EMA's speed as a share of a copy's: 1.0 is as fast as a copy).  Stretch goal:\n"
        "  a 2M put within 1.2x of the copy's time (copy_ratio >= 0.833).\n"
        "borrow rows: ema_us = median time of ema_win_grow by one segment (size) that\n"
        "  rank 0 must borrow from rank 1; there is no reference: the ucx columns are\n"
        "  empty in the CSV, '-' in the table.  Goal: ema_us <= 100.\n"
        "reclaim rows: ema_us = median time of ema_reclaim(free + size) on rank 1 (free\n"
        "  memory counts first, so the size bytes it lent are recalled) while rank 0\n"
        "  migrates the borrowed bytes to its own free memory; the ucx columns hold the\n"
        "  reference instead of raw UCX: a memcpy of size bytes from rank 1's memory to\n"
        "  rank 0's (both mapped, resident), same run (\"copy\" in the table); ratio =\n"
        "  copy / reclaim.  Goal: ema_us <= 1.25 * copy + 1000 (\"goal\" in the table).\n"
        "kernel rows: ema_us = one pass over a window half borrowed from rank 1 (a\n"
        "  CUDA kernel on the cuda kind, timed with CUDA events; a CPU loop on host);\n"
        "  the ucx columns hold the same pass over an all-local window; ratio =\n"
        "  local / borrowed.  Goal: ratio >= 0.97.\n"
        "prefetch rows (the --reclaim-sizes): ema_us = ema_win_prefetch of a window of\n"
        "  size bytes on rank 0, all borrowed from rank 1, until it is all local (rank\n"
        "  0 frees as much first); the ucx columns hold the reclaim rows' copy; ratio =\n"
        "  copy / prefetch.  Goal: ratio >= 0.9.\n"
        "On the cuda kind buffers and windows are device memory, and the copy of the\n"
        "  reclaim rows is a cudaMemcpy timed with CUDA events.  Put and get are timed\n"
        "  with CUDA events too: UCX copies on its own CUDA streams, so the events are\n"
        "  recorded on ema_perf's own, idle stream before a run of 16 ops and after\n"
        "  the run's last flush has returned; a row is the median over runs of the\n"
        "  mean per op.\n"
        "Unless EMA_DEVICE_MEMORY is set, the capacity is max(1G, 2 * --max), and with\n"
        "reclaim at least 2 * the largest reclaim size + 64M.\n");
}

static int perf_is_rank0_env(void)
{
    /* before ema_init: only the first process prints usage errors */
    const char *r = getenv("PMIX_RANK");
    return r == NULL || strcmp(r, "0") == 0;
}

/* An option error: said by rank 0 only (as getopt's own messages), then -1. */
static int perf_opt_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int perf_opt_error(const char *fmt, ...)
{
    va_list ap;
    if (perf_is_rank0_env()) {
        va_start(ap, fmt);
        fputs("ema_perf: ", stderr);
        vfprintf(stderr, fmt, ap);
        fputc('\n', stderr);
        va_end(ap);
    }
    return -1;
}

static int perf_bad(const char *opt, const char *val)
{
    return perf_opt_error("bad value for --%s: '%s'", opt, val);
}

static int perf_parse(int argc, char **argv, perf_opts_t *o)
{
    static const struct option longopts[] = {
        {"csv", no_argument, NULL, 'c'},        {"op", required_argument, NULL, 'o'},
        {"min", required_argument, NULL, 'm'},  {"max", required_argument, NULL, 'M'},
        {"iters", required_argument, NULL, 'n'}, {"warmup", required_argument, NULL, 'w'},
        {"time", required_argument, NULL, 't'}, {"ucx-thread", required_argument, NULL, 'T'},
        {"verbose", no_argument, NULL, 'v'},    {"help", no_argument, NULL, 'h'},
        {"reclaim-sizes", required_argument, NULL, 'R'},
        {"kernel-size", required_argument, NULL, 'K'},
        {"raw-mem", required_argument, NULL, 'G'},
        {"timer", required_argument, NULL, 'C'},
        {NULL, 0, NULL, 0}};
    int opt;
    char *end;

    memset(o, 0, sizeof(*o));
    snprintf(o->ops, sizeof(o->ops), "all");
    o->min      = 8;
    o->max      = 64u << 20;
    o->iters    = -1;
    o->warmup   = 10;
    o->time_cap = 0.25;
    o->reclaim_sizes[0] = 64ul << 20;
    o->reclaim_sizes[1] = 256ul << 20;
    o->reclaim_sizes[2] = 1ul << 30;
    o->nreclaim = 3;
    opterr = perf_is_rank0_env();
    while ((opt = getopt_long(argc, argv, "vh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': o->csv = 1; break;
        case 'v': o->verbose = 1; break;
        case 'o': snprintf(o->ops, sizeof(o->ops), "%s", optarg); break;
        case 'm':
            if (perf_parse_size(optarg, &o->min) != 0 || o->min == 0)
                return perf_bad("min", optarg);
            break;
        case 'M':
            if (perf_parse_size(optarg, &o->max) != 0 || o->max == 0)
                return perf_bad("max", optarg);
            break;
        case 'n':
            o->iters = strtol(optarg, &end, 10);
            if (*end != '\0' || o->iters <= 0) return perf_bad("iters", optarg);
            break;
        case 'w':
            o->warmup = strtol(optarg, &end, 10);
            if (*end != '\0' || o->warmup < 0) return perf_bad("warmup", optarg);
            break;
        case 't':
            o->time_cap = strtod(optarg, &end);
            if (*end != '\0' || !(o->time_cap > 0)) return perf_bad("time", optarg);
            break;
        case 'G':
            if (strcmp(optarg, "cudamalloc") == 0) o->raw_vmm = 0;
            else if (strcmp(optarg, "vmm") == 0) o->raw_vmm = 1;
            else return perf_bad("raw-mem", optarg);
            o->raw_mem_set = 1;
            break;
        case 'C':
            if (strcmp(optarg, "events") == 0) o->timer = PERF_TIMER_EVENTS;
            else if (strcmp(optarg, "wall") == 0) o->timer = PERF_TIMER_WALL;
            else return perf_bad("timer", optarg);
            break;
        case 'T':
            if (strcmp(optarg, "multi") == 0) o->single = 0;
            else if (strcmp(optarg, "single") == 0) o->single = 1;
            else return perf_bad("ucx-thread", optarg);
            break;
        case 'R': {
            char tmp[256], *save;
            snprintf(tmp, sizeof(tmp), "%s", optarg);
            o->nreclaim = 0;
            for (char *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                if (o->nreclaim == (int)(sizeof(o->reclaim_sizes) / sizeof(o->reclaim_sizes[0])) ||
                    perf_parse_size(tok, &o->reclaim_sizes[o->nreclaim]) != 0 ||
                    o->reclaim_sizes[o->nreclaim] == 0) {
                    return perf_bad("reclaim-sizes", optarg);
                }
                o->nreclaim++;
            }
            if (o->nreclaim == 0) return perf_bad("reclaim-sizes", optarg);
            break;
        }
        case 'K':
            if (perf_parse_size(optarg, &o->kernel_size) != 0 || o->kernel_size == 0)
                return perf_bad("kernel-size", optarg);
            break;
        case 'h': return 1;
        default: return -1;
        }
    }
    if (optind != argc) {
        return perf_opt_error("unexpected argument '%s'", argv[optind]);
    }
    if (o->max < o->min) {
        return perf_opt_error("--max is below --min");
    }
    return 0;
}

/* Which ops --op selects: a bit per perf_ops[] entry, or 0 if a name is unknown. */
static unsigned perf_select_ops(const char *list)
{
    unsigned mask = 0;
    char tmp[256];
    size_t n = strnlen(list, sizeof(tmp) - 1);
    memcpy(tmp, list, n);
    tmp[n] = '\0';
    for (char *save, *tok = strtok_r(tmp, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "all") == 0) {
            mask |= (1u << PERF_NOPS) - 1;
            continue;
        }
        int i;
        for (i = 0; i < PERF_NOPS && strcmp(tok, perf_ops[i].name) != 0; i++) {
        }
        if (i == PERF_NOPS) {
            perf_opt_error("unknown --op '%s' (in '%s')", tok, list);
            return 0;
        }
        mask |= 1u << i;
    }
    if (mask == 0) {
        perf_opt_error("--op '%s' names no operation", list);
    }
    return mask;
}

static void perf_print_header(perf_t *p, unsigned opmask)
{
    if (p->o.csv) {
        /* new columns go at the end: contrib/gpu-suite.sh reads them by position */
        printf("op,size,ema_us,ema_GBps,ucx_us,ucx_GBps,ratio,copy_us,copy_GBps,copy_ratio\n");
        return;
    }
    printf("# ema_perf %s: rank 0 (origin) -> rank 1 (target), %s memory\n",
           ema_version_string(), p->gpu ? "cuda (GPU)" : "host");
    ema_info_print(stdout, EMA_INFO_TRANSPORT);
    printf("# raw UCX %s: own context and worker (thread mode %s), target buffer %s\n"
           "#   registered without UCP_MEM_MAP_ALLOCATE, target spinning on ucp_worker_progress\n",
           ucp_get_version_string(), p->o.single ? "single" : "multi",
           !p->gpu ? "a memfd" : p->o.raw_vmm ? "one VMM allocation, like EMA's arena (cuda_ipc)"
                                              : "cudaMalloc'ed (cuda_ipc)");
    if (p->o.timer == PERF_TIMER_EVENTS) {
        printf("# us: one op + flush, timed with CUDA events on ema_perf's own stream around\n"
               "#   runs of %d ops (the last flush returned before the closing event):\n"
               "#   the median over runs of the mean per op\n", PERF_MARK_OPS);
    } else {
        printf("# us: median of one op + flush, wall clock\n");
    }
    printf("# GB/s = size / us (1 GB = 1e9 B)\n"
           "# ratio = ucx_us / ema_us: > 1 EMA faster, < 1 EMA slower than raw UCX\n");
    if (p->copy_src != NULL) {
        printf("# copy: cudaMemcpyAsync device to device of the same bytes between two\n"
               "#   cudaMalloc buffers on rank 0's GPU + cudaStreamSynchronize, same\n"
               "#   iterations and warm-up as ucx, timed with CUDA events in runs of %d\n"
               "# c_ratio = copy_us / ema_us: EMA's speed as a share of a copy's (1: as fast)\n",
               PERF_MARK_OPS);
    }
    if ((opmask & 3u) && p->copy_src != NULL) { /* put, get with the copy */
        printf("%-4s %8s %10s %9s %10s %9s %7s %10s %9s %7s %7s\n", "op", "size", "ema_us",
               "ema_GB/s", "ucx_us", "ucx_GB/s", "ratio", "copy_us", "cpy_GB/s", "c_ratio",
               "iters");
    } else if (opmask & 3u) { /* put, get; borrow and reclaim print their own */
        printf("%-4s %8s %10s %9s %10s %9s %7s %7s\n", "op", "size", "ema_us", "ema_GB/s",
               "ucx_us", "ucx_GB/s", "ratio", "iters");
    }
}

/* The column names of an op's own table: its time and rate, the
 * reference's time and rate, and what it counts (iterations or reps). */
static void perf_print_op_columns(int opw, const char *t, const char *gbs, const char *ref_t,
                                  const char *ref_gbs, const char *n)
{
    printf("%-*s %8s %10s %9s %10s %9s %7s %7s %4s\n", opw, "op", "size", t, gbs, ref_t, ref_gbs,
           "ratio", n, "goal");
}

/* Table only: what the rows of borrow and reclaim mean. */
static void perf_print_op_header(perf_t *p, const char *op)
{
    if (p->o.csv) {
        return;
    }
    if (strcmp(op, "borrow") == 0) {
        printf("# borrow: ema_win_grow by one segment on rank 0, whose own memory is full, so\n"
               "#   the segment comes from rank 1; ema_us = median grow time, size = segment\n"
               "#   size, no reference ('-'); goal: ema_us <= 100\n");
        perf_print_op_columns(7, "ema_us", "ema_GB/s", "ucx_us", "ucx_GB/s", "iters");
    } else if (strcmp(op, "reclaim") == 0) {
        printf("# reclaim: rank 1 takes back size bytes lent to rank 0 (ema_reclaim); rank 0\n"
               "#   migrates them to its own free, resident memory.  copy: the reference (in\n"
               "#   the CSV's ucx columns), memcpy of size bytes from rank 1's memory to rank\n"
               "#   0's, both mapped and resident, same run, interleaved.  ratio = copy_us /\n"
               "#   reclaim_us; goal: reclaim_us <= 1.25 * copy_us + 1000\n");
        perf_print_op_columns(7, "reclaim_us", "GB/s", "copy_us", "copy_GB/s", "reps");
    } else if (strcmp(op, "prefetch") == 0) {
        printf("# prefetch: rank 0's window of size bytes, all borrowed from rank 1; rank 0\n"
               "#   frees as much of its own memory and times ema_win_prefetch until the\n"
               "#   window is all local.  copy: as for reclaim.  ratio = copy_us /\n"
               "#   prefetch_us; goal: ratio >= 0.9\n");
        perf_print_op_columns(8, "prefetch_us", "GB/s", "copy_us", "copy_GB/s", "reps");
    } else if (strcmp(op, "kernel") == 0) {
        printf("# kernel: one pass that reads and writes every word of a window of size\n"
               "#   bytes on rank 0, half of it borrowed from rank 1 (ema_us), against the\n"
               "#   same pass over an all-local window (local_us, the CSV's ucx columns);\n"
               "#   %s; ratio = local_us / ema_us; goal: ratio >= 0.97\n",
               p->gpu ? "a CUDA kernel timed with CUDA events" : "a CPU loop, wall clock");
        perf_print_op_columns(7, "ema_us", "ema_GB/s", "local_us", "loc_GB/s", "reps");
    }
}

static void perf_print_row(perf_t *p, const char *op, size_t size, const perf_row_t *row)
{
    double e = row->us[IMPL_EMA], u = row->us[IMPL_RAW], c = row->us[IMPL_COPY];
    double egb = e > 0 ? (double)size / (e * 1e3) : 0.0;
    double ugb = u > 0 ? (double)size / (u * 1e3) : 0.0;
    double cgb = c > 0 ? (double)size / (c * 1e3) : 0.0;
    double ratio = e > 0 ? u / e : 0.0;
    double cratio = e > 0 ? c / e : 0.0;
    /* the CSV's last three columns: the copy reference, or empty */
    char cp[96] = "";
    if (row->has_copy) {
        snprintf(cp, sizeof(cp), "%.3f,%.4f,%.3f", c, cgb, cratio);
    } else {
        snprintf(cp, sizeof(cp), ",,");
    }

    if (row->no_ref || strcmp(op, "reclaim") == 0 || strcmp(op, "kernel") == 0 ||
        strcmp(op, "prefetch") == 0) {
        /* borrow, reclaim, kernel, prefetch: goal column, wider op column */
        const char *goal = "-";
        int w = (int)strlen(op) > 7 ? (int)strlen(op) : 7;
        if (strcmp(op, "borrow") == 0) {
            goal = e <= 100.0 ? "ok" : "MISS";
        } else if (strcmp(op, "kernel") == 0) {
            goal = ratio >= 0.97 ? "ok" : "MISS";
        } else if (strcmp(op, "prefetch") == 0) {
            goal = ratio >= 0.9 ? "ok" : "MISS";
        } else if (!row->no_ref) {
            goal = e <= 1.25 * u + 1000.0 ? "ok" : "MISS";
        }
        char s[32];
        if (p->o.csv && row->no_ref) {
            printf("%s,%zu,%.3f,%.4f,,,,%s\n", op, size, e, egb, cp);
        } else if (p->o.csv) {
            printf("%s,%zu,%.3f,%.4f,%.3f,%.4f,%.3f,%s\n", op, size, e, egb, u, ugb, ratio, cp);
        } else if (row->no_ref) {
            printf("%-*s %8s %10.3f %9.4f %10s %9s %7s %7zu %4s\n", w, op,
                   perf_size_str(size, s, sizeof(s)), e, egb, "-", "-", "-", row->n[IMPL_EMA],
                   goal);
        } else {
            printf("%-*s %8s %10.1f %9.4f %10.1f %9.4f %7.3f %7zu %4s\n", w, op,
                   perf_size_str(size, s, sizeof(s)), e, egb, u, ugb, ratio, row->n[IMPL_EMA],
                   goal);
        }
    } else if (p->o.csv) {
        printf("%s,%zu,%.3f,%.4f,%.3f,%.4f,%.3f,%s\n", op, size, e, egb, u, ugb, ratio, cp);
    } else if (p->copy_src != NULL) { /* the table has the copy's columns */
        char s[32];
        if (row->has_copy) {
            printf("%-4s %8s %10.3f %9.4f %10.3f %9.4f %7.3f %10.3f %9.4f %7.3f %7zu\n", op,
                   perf_size_str(size, s, sizeof(s)), e, egb, u, ugb, ratio, c, cgb, cratio,
                   row->n[IMPL_EMA]);
        } else {
            printf("%-4s %8s %10.3f %9.4f %10.3f %9.4f %7.3f %10s %9s %7s %7zu\n", op,
                   perf_size_str(size, s, sizeof(s)), e, egb, u, ugb, ratio, "-", "-", "-",
                   row->n[IMPL_EMA]);
        }
    } else {
        char s[32];
        printf("%-4s %8s %10.3f %9.4f %10.3f %9.4f %7.3f %7zu\n", op,
               perf_size_str(size, s, sizeof(s)), e, egb, u, ugb, ratio, row->n[IMPL_EMA]);
    }
    fflush(stdout);
}

int main(int argc, char **argv)
{
    perf_t perf, *p = &perf;
    ema_init_params_t ip;
    int size, rc;

    memset(p, 0, sizeof(*p));
    rc = perf_parse(argc, argv, &p->o);
    if (rc != 0) {
        if (perf_is_rank0_env()) {
            perf_usage(rc > 0 ? stdout : stderr);
        }
        if (rc > 0 && (fflush(stdout) != 0 || ferror(stdout))) {
            fprintf(stderr, "ema_perf: writing the usage failed: %s\n", strerror(errno));
            return 1; /* -h into a full disk or a closed pipe */
        }
        return rc > 0 ? 0 : 2;
    }
    unsigned opmask = perf_select_ops(p->o.ops);
    if (opmask == 0) { /* perf_select_ops named the word */
        if (perf_is_rank0_env()) {
            perf_usage(stderr);
        }
        return 2;
    }

    memset(&ip, 0, sizeof(ip));
    if (getenv("EMA_DEVICE_MEMORY") == NULL) {
        /* room for the target's part; EMA_DEVICE_MEMORY, when set, wins */
        ip.field_mask    = EMA_INIT_PARAM_FIELD_DEVICE_MEMORY;
        ip.device_memory = 2 * p->o.max > (1ul << 30) ? 2 * p->o.max : (1ul << 30);
        if (opmask & ((1u << PERF_OP_RECLAIM) | (1u << PERF_OP_PREFETCH))) {
            /* room for reclaim and prefetch: rank 1 lends N while rank 0
             * keeps N free */
            size_t maxn = 0;
            for (int i = 0; i < p->o.nreclaim; i++) {
                maxn = p->o.reclaim_sizes[i] > maxn ? p->o.reclaim_sizes[i] : maxn;
            }
            if (2 * maxn + (64ul << 20) > ip.device_memory) {
                ip.device_memory = 2 * maxn + (64ul << 20);
            }
        }
        if (opmask & (1u << PERF_OP_KERNEL)) {
            const char *kind = getenv("EMA_MEMORY_KIND");
            size_t k = p->o.kernel_size ? p->o.kernel_size
                     : (kind != NULL && strcmp(kind, "cuda") == 0) ? (1ul << 30) : (256ul << 20);
            if (2 * k + (256ul << 20) > ip.device_memory) {
                ip.device_memory = 2 * k + (256ul << 20);
            }
        }
    }
    EMA_CHECK(ema_init(&ip));
    EMA_CHECK(ema_world_rank(&p->rank));
    EMA_CHECK(ema_world_size(&size));
    if (size != 2) {
        if (p->rank == 0) {
            fprintf(stderr, "ema_perf: needs exactly 2 ranks (mpirun -n 2 ema_perf), got %d\n",
                    size);
        }
        ema_finalize();
        return 2;
    }

    {
        ema_mem_stat_t ms = {0};
        EMA_CHECK(ema_mem_stat(&ms));
        p->gpu = (ms.memory_kind == EMA_MEMORY_KIND_CUDA);
        if (p->gpu && perf_gpu_init(ms.device < 0 ? 0 : ms.device) != 0) {
            perf_die("the cuda memory kind needs ema_perf's GPU side: %s", perf_gpu_error());
        }
        if (p->o.raw_mem_set && !p->gpu) {
            /* the host kind's raw target is a memfd: nothing to choose */
            if (p->rank == 0) {
                fprintf(stderr, "ema_perf: --raw-mem needs the cuda memory kind "
                        "(EMA_MEMORY_KIND=cuda)\n");
            }
            ema_finalize();
            return 2;
        }
        if (p->o.timer == PERF_TIMER_AUTO) {
            p->o.timer = p->gpu ? PERF_TIMER_EVENTS : PERF_TIMER_WALL;
        } else if (p->o.timer == PERF_TIMER_EVENTS && !p->gpu) {
            /* a bad option for this kind: exit 2, as for any bad option */
            if (p->rank == 0) {
                fprintf(stderr, "ema_perf: --timer events needs the cuda memory kind "
                        "(EMA_MEMORY_KIND=cuda)\n");
            }
            ema_finalize();
            return 2;
        }
    }
    EMA_CHECK(ema_win_allocate(CTL_SIZE, NULL, (void **)&p->ctl_base, &p->ctl_win));
    perf_mem_zero(p, p->ctl_base, CTL_SIZE);
    {
        /* the segment size: a 1-byte window reserves exactly one segment */
        ema_win_h w;
        void *b;
        ema_win_stat_t ws = {0};
        EMA_CHECK(ema_win_allocate(1, NULL, &b, &w));
        EMA_CHECK(ema_win_stat(w, &ws));
        EMA_CHECK(ema_win_free(w));
        p->seg = ws.max_size;
    }
    ema_status_t st = ema_win_allocate(p->rank == PERF_TARGET ? p->o.max : 0, NULL,
                                       (void **)&p->data_base, &p->data_win);
    if (st != EMA_SUCCESS) {
        perf_die("ema_win_allocate(%zu bytes on the target) failed: %s%s", p->o.max,
                 ema_strerror(st),
                 st == EMA_ERR_NO_MEMORY ? " (raise EMA_DEVICE_MEMORY or lower --max)" : "");
    }
    if (p->rank == PERF_ORIGIN && p->gpu) {
        if ((p->buf = perf_gpu_alloc(p->o.max)) == NULL) {
            perf_die("origin buffer: %s", perf_gpu_error());
        }
        perf_mem_zero(p, p->buf, p->o.max);
    } else if (p->rank == PERF_ORIGIN) {
        if (posix_memalign((void **)&p->buf, 2u << 20, p->o.max) != 0) {
            perf_die("out of memory for a %zu-byte buffer", p->o.max);
        }
        memset(p->buf, 0, p->o.max);
    } else {
        perf_mem_zero(p, p->data_base, p->o.max);
    }
    if (p->rank == PERF_ORIGIN && p->gpu && (opmask & 3u)) {
        /* put, get: the copy reference's two buffers */
        if ((p->copy_src = perf_gpu_alloc(p->o.max)) == NULL ||
            (p->copy_dst = perf_gpu_alloc(p->o.max)) == NULL) {
            perf_die("copy reference buffers (2 x %zu bytes): %s", p->o.max, perf_gpu_error());
        }
    }
    EMA_CHECK(ema_barrier());

    perf_raw_setup(p);
    perf_raw_connect(p);

    if (p->rank == PERF_ORIGIN) {
        perf_print_header(p, opmask);
        if (p->o.verbose && !p->o.csv) {
            printf("# raw UCX endpoint to the target:\n");
            ucp_ep_print_info(p->ep, stdout);
        }
    }

    rc = 0;
    for (int i = 0; i < PERF_NOPS && rc == 0; i++) {
        if (!(opmask & (1u << i))) {
            continue;
        }
        if (perf_ops[i].sizes != NULL) {
            size_t sizes[16];
            int nsizes = perf_ops[i].sizes(p, sizes, 16);
            if (p->rank == PERF_ORIGIN) {
                perf_print_op_header(p, perf_ops[i].name);
            }
            for (int k = 0; k < nsizes && rc == 0; k++) {
                perf_row_t row;
                memset(&row, 0, sizeof(row));
                if (perf_ops[i].measure(p, i, sizes[k], &row) != 0) {
                    rc = 1;
                    break;
                }
                if (p->rank == PERF_ORIGIN && !row.skipped) {
                    perf_print_row(p, perf_ops[i].name, sizes[k], &row);
                }
            }
            continue;
        }
        for (size_t s = p->o.min; s <= p->o.max && rc == 0; s *= 2) {
            perf_row_t row;
            memset(&row, 0, sizeof(row));
            if (perf_ops[i].measure(p, i, s, &row) != 0) {
                rc = 1;
                break;
            }
            if (p->rank == PERF_ORIGIN) {
                perf_print_row(p, perf_ops[i].name, s, &row);
            }
            if (s > p->o.max / 2) {
                break; /* no overflow past --max */
            }
        }
    }
    if (rc != 0 && p->rank == PERF_ORIGIN) {
        fprintf(stderr, "ema_perf: stopped: a call or the data verification failed\n");
    }

    EMA_CHECK(ema_barrier());
    perf_raw_teardown(p);
    EMA_CHECK(ema_barrier());
    for (int i = 0; i < IMPL_NUM; i++) {
        free(p->samples[i]);
    }
    if (p->gpu) {
        perf_gpu_free(p->buf);
        perf_gpu_free(p->copy_src);
        perf_gpu_free(p->copy_dst);
    } else {
        free(p->buf);
    }
    EMA_CHECK(ema_win_free(p->data_win));
    EMA_CHECK(ema_win_free(p->ctl_win));
    EMA_CHECK(ema_finalize());
    return rc;
}
