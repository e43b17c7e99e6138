/*
 * The cuda kind's data paths for put and get (EMA_CUDA_PATH).
 *
 *   ucx     ucp_put_nbx/ucp_get_nbx on the registered segments: zero-copy
 *           where UCX's cuda_ipc shares VMM allocations exported as POSIX
 *           fds (UCX's development branch); UCX 1.22 (pip's libucx-cu13)
 *           does not, and stages every byte through host memory (0.4-0.6
 *           GB/s against 160 GB/s at 2 MiB, measured on the H200 with that
 *           wheel before this path existed: DESIGN.md).
 *   direct  EMA's own: each peer's arena is mirrored in a range reserved
 *           here, a segment is mapped into it on first use from the handle
 *           the peer exported at init (pidfd_getfd, then the VMM import a
 *           borrow does), and put and get are copies on the copy engines,
 *           queued on a stream of EMA's own and waited for together.
 *   auto    direct where the probe below finds UCX not zero-copy to a peer,
 *           or slower than the direct copy; ucx where the direct path
 *           cannot map a peer's memory (no ptrace rights).
 *
 * The probe runs once, at the end of ema_init: each rank puts and gets
 * 2 MiB to and from the last segment of every peer's arena (free until
 * every rank has returned from ema_init, which the closing barrier
 * ensures) through UCX, and copies the same bytes through the mirror.
 *
 * The direct path keeps the contract of the UCX one: an operation counts
 * in flight (ctx->inflight, by epoch) from before it resolves a segment's
 * location until its copies have completed, so a migration's invalidation
 * waits for it, and it lands wholly in the old copy or wholly in the new.
 * Its non-blocking forms complete before they return: holding a migration
 * off until the application waits would let one idle request stall a
 * lender's reclaim.  Atomics are performed by the rank holding the word,
 * as on the UCX path.
 *
 * The spill tier (EMA_CUDA_SPILL=y) is not mirrored: a run in this rank's
 * own tier is a copy through its mapping here, a run in a peer's goes
 * through UCX, completed (and a put flushed) before the next.
 */
#include "rma_priv.h"

#include "util/clock.h"
#include "util/log.h"

#include <stdlib.h>
#include <string.h>

#define CPATH_PROBE_BYTES (2u << 20)
#define CPATH_PROBE_ITERS 4
/* UCX is zero-copy to a peer when it moves the probe at this share of the
 * direct copy's speed (staged through host memory it reached well under 1% on the H200),
 * or, where there is no direct path to compare with, at this many GB/s. */
#define CPATH_ZCOPY_SHARE 0.25
#define CPATH_ZCOPY_GBPS  20.0

static const char *cpath_name(int path)
{
    return path == EMA_CUDA_PATH_DIRECT ? "direct" : path == EMA_CUDA_PATH_UCX ? "ucx" : "auto";
}

static int cpath_cuda(const ema__win_ctx_t *ctx)
{
    const ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    return dev != NULL && dev->ops->kind == EMA_MEMORY_KIND_CUDA &&
           dev->ops->seg_handle != NULL && dev->ops->rma_copy_start != NULL;
}

static uint32_t cpath_own_nsegs(const ema__win_ctx_t *ctx)
{
    const ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    return cpath_cuda(ctx) ? (uint32_t)(dev->capacity / dev->seg_size) : 0;
}

size_t ema__win_cpath_blob_len(const ema__win_ctx_t *ctx)
{
    return sizeof(uint32_t) + (size_t)cpath_own_nsegs(ctx) * sizeof(int32_t);
}

void ema__win_cpath_blob(const ema__win_ctx_t *ctx, char *p)
{
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    uint32_t n = cpath_own_nsegs(ctx);

    memcpy(p, &n, sizeof(n));
    p += sizeof(n);
    for (uint32_t i = 0; i < n; i++) {
        int32_t h = (int32_t)dev->ops->seg_handle(dev, i);
        memcpy(p + (size_t)i * sizeof(h), &h, sizeof(h));
    }
}

static ema_status_t cpath_alloc(ema__win_ctx_t *ctx)
{
    ema__win_cpath_t *cp = &ctx->cpath;
    size_t n = (size_t)(unsigned)ctx->size;

    cp->nh      = calloc(n, sizeof(*cp->nh));
    cp->handles = calloc(n, sizeof(*cp->handles));
    cp->mirror  = calloc(n, sizeof(*cp->mirror));
    cp->mapped  = calloc(n, sizeof(*cp->mapped));
    cp->ucx_put = calloc(n, sizeof(double));
    cp->ucx_get = calloc(n, sizeof(double));
    cp->direct  = calloc(n, sizeof(double));
    if (cp->nh == NULL || cp->handles == NULL || cp->mirror == NULL || cp->mapped == NULL ||
        cp->ucx_put == NULL || cp->ucx_get == NULL || cp->direct == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    return EMA_SUCCESS;
}

ema_status_t ema__win_cpath_connect(ema__win_ctx_t *ctx, int rank, const char *p,
                                    const char *end)
{
    ema__win_cpath_t *cp = &ctx->cpath;
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    uint32_t n;

    if (p + sizeof(n) > end) {
        goto malformed;
    }
    memcpy(&n, p, sizeof(n));
    p += sizeof(n);
    if ((size_t)(end - p) / sizeof(int32_t) < n ||
        (uint64_t)n * ctx->seg_size > ctx->exports[EMA_TIER_DEVICE][rank].capacity) {
        goto malformed;
    }
    if (!cpath_cuda(ctx) || n == 0) {
        return EMA_SUCCESS; /* host kind: no handles, no mirror */
    }
    if (cp->nh == NULL && cpath_alloc(ctx) != EMA_SUCCESS) {
        return EMA_ERR_NO_MEMORY;
    }
    cp->nh[rank]      = n;
    cp->handles[rank] = malloc((size_t)n * sizeof(int32_t));
    cp->mapped[rank]  = calloc(n, sizeof(_Atomic uint8_t));
    if (cp->handles[rank] == NULL || cp->mapped[rank] == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    memcpy(cp->handles[rank], p, (size_t)n * sizeof(int32_t));
    if (rank == ctx->rank) {
        cp->mirror[rank] = dev->base; /* our own arena, mapped whole */
        for (uint32_t i = 0; i < n; i++) {
            atomic_init(&cp->mapped[rank][i], 1);
        }
        return EMA_SUCCESS;
    }
    if (cp->cfg == EMA_CUDA_PATH_UCX) {
        return EMA_SUCCESS; /* no mirror: nothing is ever mapped */
    }
    void *addr;
    ema_status_t status = dev->ops->reserve(dev, (size_t)n * ctx->seg_size, &addr);
    if (status != EMA_SUCCESS) {
        ema_warn("no address space to mirror rank %d's memory (%s): its put and get go "
                 "through ucx", rank, ema_strerror(status));
        return EMA_SUCCESS;
    }
    cp->mirror[rank] = addr;
    return EMA_SUCCESS;

malformed:
    ema_error("malformed segment handles from rank %d in the modex", rank);
    return EMA_ERR_BOOTSTRAP;
}

void ema__win_cpath_cleanup(ema__win_ctx_t *ctx)
{
    ema__win_cpath_t *cp = &ctx->cpath;
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];

    for (int r = 0; cp->nh != NULL && r < ctx->size; r++) {
        if (r != ctx->rank && cp->mirror[r] != NULL) {
            for (uint32_t i = 0; i < cp->nh[r]; i++) {
                if (atomic_load(&cp->mapped[r][i])) {
                    dev->ops->unmap(dev, cp->mirror[r] + (size_t)i * ctx->seg_size,
                                    ctx->seg_size);
                }
            }
            dev->ops->unreserve(dev, cp->mirror[r], (size_t)cp->nh[r] * ctx->seg_size);
        }
        free(cp->handles[r]);
        free((void *)cp->mapped[r]);
    }
    free(cp->nh);
    free(cp->handles);
    free(cp->mirror);
    free((void *)cp->mapped);
    free(cp->ucx_put);
    free(cp->ucx_get);
    free(cp->direct);
    int cfg = cp->cfg;
    pthread_mutex_destroy(&cp->lock);
    memset(cp, 0, sizeof(*cp));
    cp->cfg = cfg;
}

/* Map segment @seg of rank @rank into its mirror, once. */
static ema_status_t cpath_map(ema__win_ctx_t *ctx, int rank, uint32_t seg)
{
    ema__win_cpath_t *cp = &ctx->cpath;
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    ema_status_t status = EMA_SUCCESS;

    pthread_mutex_lock(&cp->lock);
    if (!atomic_load_explicit(&cp->mapped[rank][seg], memory_order_acquire)) {
        status = dev->ops->map(dev, &ctx->exports[EMA_TIER_DEVICE][rank], seg,
                               cp->handles[rank][seg],
                               cp->mirror[rank] + (size_t)seg * ctx->seg_size);
        if (status == EMA_SUCCESS) {
            atomic_store_explicit(&cp->mapped[rank][seg], 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&cp->lock);
    return status;
}

char *ema__win_cpath_seg(ema__win_ctx_t *ctx, int rank, uint32_t seg)
{
    ema__win_cpath_t *cp = &ctx->cpath;

    if (cp->mirror == NULL || rank < 0 || rank >= ctx->size || cp->mirror[rank] == NULL ||
        seg >= cp->nh[rank]) {
        return NULL;
    }
    if (!atomic_load_explicit(&cp->mapped[rank][seg], memory_order_acquire) &&
        cpath_map(ctx, rank, seg) != EMA_SUCCESS) {
        return NULL;
    }
    return cp->mirror[rank] + (size_t)seg * ctx->seg_size;
}

char *ema__win_cpath_addr(ema__win_ctx_t *ctx, int rank, uint64_t raddr)
{
    uint64_t off = raddr - ctx->mr[EMA_TIER_DEVICE].bases[rank];
    uint64_t seg = off / ctx->seg_size;
    char *p = (seg <= UINT32_MAX) ? ema__win_cpath_seg(ctx, rank, (uint32_t)seg) : NULL;

    if (p == NULL) {
        ema_error("rank %d's segment %llu cannot be reached through a mirror here", rank,
                  (unsigned long long)seg);
        return NULL;
    }
    return p + off % ctx->seg_size;
}

static void cpath_noop_cb(void *request, ucs_status_t status, void *user_data)
{
}

/* One UCX put (or get) of @len bytes between @local and @raddr of @peer's
 * memory of @tier, completed, then the endpoint flushed. */
static ema_status_t cpath_ucx_op(ema__win_ctx_t *ctx, int peer, int tier, int get, void *local,
                                 uint64_t raddr, size_t len)
{
    ucp_request_param_t param = {.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK,
                                 .cb.send      = cpath_noop_cb};
    ucp_rkey_h rkey = ema__xport_mr_rkey(&ctx->mr[tier], peer, raddr);
    ucs_status_ptr_t sp = get ? ucp_get_nbx(ctx->xp->eps[peer], local, len, raddr, rkey, &param)
                              : ucp_put_nbx(ctx->xp->eps[peer], local, len, raddr, rkey, &param);
    ema_status_t status = ema__xport_wait_req(ctx->xp, sp, peer,
                                              get ? "ucp_get_nbx" : "ucp_put_nbx");
    return (status == EMA_SUCCESS) ? ema__xport_flush_ep(ctx->xp, peer) : status;
}

/* --- put and get ------------------------------------------------------------ */

/*
 * A put or get on the direct path: each run is a copy on the copy
 * engines through the holder's segment, mapped here.  The runs stay in
 * flight, counted by epoch, until one wait completes them all; before
 * waiting on a moving segment the copies issued so far are completed and
 * let go, since that migration waits for them.
 */
/* Complete the copies issued, then let their runs out of flight. */
static ema_status_t rma_cdirect_drain(ema__win_ctx_t *ctx, ema__mem_arena_t *dev, int held[2])
{
    ema_status_t status = dev->ops->rma_copy_wait(dev);
    for (int e = 0; e < 2; e++) {
        for (; held[e] > 0; held[e]--) {
            rma_leave(ctx, e);
        }
    }
    return status;
}

ema_status_t ema__win_rma_cdirect(ema_win_h win, ema_op_t op, int rank, size_t offset,
                                void *buf, size_t len)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    ema__win_part_t *part = &win->parts[rank];
    ema_status_t status = EMA_SUCCESS, st;
    int held[2] = {0, 0}, trank, tier, ep;
    uint64_t raddr;

    while (len > 0 && status == EMA_SUCCESS) {
        ep = rma_in(ctx);
        size_t n = rma_run(win, part, offset, len, &trank, &tier, &raddr);
        if (n == 0 || n == SIZE_MAX || n == EMA_RUN_LOST) {
            rma_leave(ctx, ep);
            if (n != 0) {
                status = (n == EMA_RUN_LOST) ? EMA_ERR_PEER_LOST : EMA_ERR_RANGE;
                break;
            }
            status = rma_cdirect_drain(ctx, dev, held);
            ema__xport_wait_step(ctx->xp, EMA_WAIT_QUICK);
            continue;
        }
        char *p = NULL;
        held[ep]++;
        if (tier == EMA_TIER_DEVICE) {
            p = ema__win_cpath_addr(ctx, trank, raddr);
        } else if (trank == ctx->rank && ctx->tier[tier] != NULL) {
            /* our own spill tier, mapped here */
            p = (char *)ctx->tier[tier]->base + (raddr - ctx->mr[tier].bases[trank]);
        } else {
            /* a peer's spill tier: no mirror, UCX */
            ema__xport_app_enter(ctx->xp);
            status = cpath_ucx_op(ctx, trank, tier, op == EMA_OP_GET, buf, raddr, n);
            ema__xport_app_leave(ctx->xp);
            goto next;
        }
        if (p == NULL) {
            status = EMA_ERR_TRANSPORT;
            break;
        }
        status = (op == EMA_OP_PUT) ? dev->ops->rma_copy_start(dev, p, buf, n)
                                    : dev->ops->rma_copy_start(dev, buf, p, n);
    next:
        buf = (char *)buf + n;
        offset += n;
        len -= n;
    }
    st = rma_cdirect_drain(ctx, dev, held);
    return (status == EMA_SUCCESS) ? st : status;
}

/* --- the probe -------------------------------------------------------------- */

/* GB/s of @iters UCX puts (or gets) of @len bytes between @local and
 * @raddr of @peer, each completed with a flush of the endpoint; 0 on
 * failure. */
static double cpath_probe_ucx(ema__win_ctx_t *ctx, int peer, int get, void *local,
                              uint64_t raddr, size_t len)
{
    double t0 = 0;

    for (int i = 0; i <= CPATH_PROBE_ITERS; i++) {
        if (i == 1) {
            t0 = ema__now_us(); /* the first one warms the path up */
        }
        if (cpath_ucx_op(ctx, peer, EMA_TIER_DEVICE, get, local, raddr, len) != EMA_SUCCESS) {
            return 0;
        }
    }
    double us = ema__now_us() - t0;
    return us > 0 ? (double)len * CPATH_PROBE_ITERS / us / 1e3 : 0;
}

/* GB/s of copies of @len bytes from @local to @dst (the mirror); 0 on
 * failure. */
static double cpath_probe_direct(ema__win_ctx_t *ctx, void *dst, void *local, size_t len)
{
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    double t0 = 0;

    for (int i = 0; i <= CPATH_PROBE_ITERS; i++) {
        if (i == 1) {
            t0 = ema__now_us();
        }
        if (dev->ops->rma_copy_start(dev, dst, local, len) != EMA_SUCCESS ||
            dev->ops->rma_copy_wait(dev) != EMA_SUCCESS) {
            return 0;
        }
    }
    double us = ema__now_us() - t0;
    return us > 0 ? (double)len * CPATH_PROBE_ITERS / us / 1e3 : 0;
}

static int cpath_ucx_zcopy(const ema__win_cpath_t *cp, int r)
{
    double floor = cp->direct[r] > 0 ? CPATH_ZCOPY_SHARE * cp->direct[r] : CPATH_ZCOPY_GBPS;
    return cp->ucx_put[r] >= floor && cp->ucx_get[r] >= floor;
}

ema_status_t ema__win_cuda_path_select(ema__win_ctx_t *ctx)
{
    ema__win_cpath_t *cp = &ctx->cpath;
    ema__mem_arena_t *dev = ctx->tier[EMA_TIER_DEVICE];
    int me = ctx->rank, direct_all = 1, zcopy_all = 1, faster_all = 1;
    ema_status_t status;

    if (!cpath_cuda(ctx) || cp->nh == NULL) {
        return EMA_SUCCESS;
    }
    size_t len = CPATH_PROBE_BYTES < ctx->seg_size ? CPATH_PROBE_BYTES : ctx->seg_size;
    uint32_t own = cp->nh[me];
    void *local = (char *)dev->base + (size_t)(own - 1) * ctx->seg_size; /* free now */

    for (int r = 0; r < ctx->size; r++) {
        if (r == me) {
            continue;
        }
        uint64_t raddr = ctx->mr[EMA_TIER_DEVICE].bases[r] +
                         (uint64_t)(cp->nh[r] - 1) * ctx->seg_size;
        if (cp->cfg != EMA_CUDA_PATH_DIRECT) { /* forced direct: UCX's figures unused */
            cp->ucx_put[r] = cpath_probe_ucx(ctx, r, 0, local, raddr, len);
            cp->ucx_get[r] = cpath_probe_ucx(ctx, r, 1, local, raddr, len);
        }
        char *dst = (cp->cfg != EMA_CUDA_PATH_UCX && cp->mirror[r] != NULL)
                        ? ema__win_cpath_addr(ctx, r, raddr)
                        : NULL;
        cp->direct[r] = dst != NULL ? cpath_probe_direct(ctx, dst, local, len) : 0;
        direct_all = direct_all && cp->direct[r] > 0;
        zcopy_all  = zcopy_all && cpath_ucx_zcopy(cp, r);
        faster_all = faster_all && cp->direct[r] >= cp->ucx_put[r] &&
                     cp->direct[r] >= cp->ucx_get[r];
        ema_debug("cuda path to rank %d: ucx put %.1f GB/s, get %.1f GB/s (%s); direct "
                  "copy %.1f GB/s", r, cp->ucx_put[r], cp->ucx_get[r],
                  cpath_ucx_zcopy(cp, r) ? "zero-copy" : "staged", cp->direct[r]);
    }
    int32_t verdict = EMA_SUCCESS;
    switch (cp->cfg) {
    case EMA_CUDA_PATH_UCX:
        cp->on = 0;
        break;
    case EMA_CUDA_PATH_DIRECT:
        if (!direct_all) {
            ema_error("EMA_CUDA_PATH=direct: a peer's gpu memory cannot be mapped here (see "
                      "the error above); set EMA_CUDA_PATH=auto or ucx");
            verdict = EMA_ERR_UNSUPPORTED;
        }
        cp->on = 1;
        break;
    default:
        cp->on = direct_all && (!zcopy_all || faster_all);
        break;
    }
    /* A world of one: its puts and gets to itself are copies too, unless
     * told otherwise. */
    if (ctx->size == 1) {
        cp->on = cp->cfg != EMA_CUDA_PATH_UCX;
    }
    cp->tried = 1;
    for (int r = 0; !cp->on && r < ctx->size; r++) {
        if (r != me && !cpath_ucx_zcopy(cp, r)) {
            ema_warn("put and get to rank %d run at %.2f / %.2f GB/s through UCX: it is not "
                     "zero-copy to gpu memory here (UCX 1.22 from pip stages VMM memory "
                     "through the host)%s", r, cp->ucx_put[r], cp->ucx_get[r],
                     cp->cfg == EMA_CUDA_PATH_UCX ? "; EMA_CUDA_PATH=auto would copy directly"
                                                  : "; EMA's direct path cannot map its "
                                                    "memory either (ptrace rights?)");
        }
    }
    ema_debug("cuda path: %s (EMA_CUDA_PATH=%s)", cp->on ? "direct" : "ucx",
              cpath_name(cp->cfg));
    /* Every rank's verdict, so that all fail alike; and nobody uses a
     * segment the probes write into before every rank is done. */
    void **blobs;
    size_t *lens;
    status = ema__xport_allgather(ctx->xp, &verdict, sizeof(verdict), &blobs, &lens);
    if (status != EMA_SUCCESS) {
        return status;
    }
    for (int r = 0; r < ctx->size; r++) {
        int32_t v = EMA_ERR_BOOTSTRAP;
        if (lens[r] == sizeof(v)) {
            memcpy(&v, blobs[r], sizeof(v));
        }
        if (v != EMA_SUCCESS && status == EMA_SUCCESS) {
            if (r != me) {
                ema_error("rank %d could not set up its cuda path (EMA_CUDA_PATH=%s)", r,
                          cpath_name(cp->cfg));
            }
            status = (ema_status_t)v;
        }
    }
    ema__xport_free_blobs(ctx->xp, blobs, lens);
    return status;
}

void ema__win_cpath_print(const ema__win_ctx_t *ctx, FILE *stream)
{
    const ema__win_cpath_t *cp = &ctx->cpath;

    if (!cpath_cuda(ctx) || !cp->tried) {
        return;
    }
    fprintf(stream, "# cuda path:     %s (EMA_CUDA_PATH=%s)\n",
            cp->on ? "direct: copy engines, peers' segments mapped here" : "ucx",
            cpath_name(cp->cfg));
    for (int r = 0; r < ctx->size; r++) {
        if (r == ctx->rank) {
            continue;
        }
        if (cp->cfg == EMA_CUDA_PATH_DIRECT) {
            fprintf(stream, "#   to rank %-4d ucx not probed; direct copy %7.1f GB/s\n", r,
                    cp->direct[r]);
            continue;
        }
        fprintf(stream, "#   to rank %-4d ucx put %7.1f GB/s, get %7.1f GB/s (%s); direct "
                "copy %7.1f GB/s\n", r, cp->ucx_put[r], cp->ucx_get[r],
                cpath_ucx_zcopy(cp, r) ? "zero-copy" : "staged", cp->direct[r]);
    }
}
