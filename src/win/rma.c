/*
 * Put, get and atomics.  The fast path: check the state and arguments, walk
 * the target part's segment table, and issue one UCX operation per run of
 * segments that are contiguous in one arena.  No lock, no malloc and no
 * system call, except the malloc of an aggregate request when a non-blocking
 * operation spans several runs.
 */
#include "rma_priv.h"

#include "util/log.h"
#include "util/state.h"

#include <stdlib.h>
#include <string.h>

static struct ema_request ema_req_done = {.magic = EMA_REQ_MAGIC_DONE};

/* Whether @rank is lost.  Without a progress thread, nothing else may look
 * for dead peers between this thread's waits (a put or a get over shared
 * memory completes without one): look here, at most every 2 ms. */
static inline int rma_peer_lost(ema__win_ctx_t *ctx, int rank)
{
    if (!ctx->progress_thread) {
        ema__xport_peers_check(ctx->xp);
    }
    return ema__xport_peer_lost(ctx->xp, rank);
}

static inline ema_status_t rma_check(ema_win_h win, int rank, size_t offset, const void *buf,
                                     size_t len)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (rank < 0 || rank >= win->ctx->size) {
        return EMA_ERR_INVALID_RANK;
    }
    if (buf == NULL && len > 0) {
        return EMA_ERR_INVALID_PARAM;
    }
    if (rma_peer_lost(win->ctx, rank)) {
        return EMA_ERR_PEER_LOST; /* its part went with it */
    }
    size_t psize = atomic_load_explicit(&win->parts[rank].size, memory_order_acquire);
    if (offset > psize || len > psize - offset) {
        /* The part may have grown since we cached it: ask its owner once. */
        if (rank == win->ctx->rank || offset > win->parts[rank].max_segs * win->ctx->seg_size ||
            len > win->parts[rank].max_segs * win->ctx->seg_size - offset ||
            ema__win_fetch(win, rank) != EMA_SUCCESS) {
            return EMA_ERR_RANGE;
        }
        psize = atomic_load_explicit(&win->parts[rank].size, memory_order_acquire);
        if (offset > psize || len > psize - offset) {
            return EMA_ERR_RANGE;
        }
    }
    return EMA_SUCCESS;
}

/* An operation handed to UCX: counted for the flushes of @trank (see
 * ema_win_flush), then out of flight. */
static inline void rma_issued(ema__win_ctx_t *ctx, int trank, int ep)
{
    atomic_fetch_add(&ctx->issued[trank], 1);
    atomic_fetch_add(&ctx->issued_all, 1);
    rma_leave(ctx, ep);
}

/* A segment is moving: let the migration finish (answering invalidations
 * ourselves if need be), then look again. */
static int rma_wait_moving(ema__win_ctx_t *ctx, int ep)
{
    rma_leave(ctx, ep);
    ema__xport_wait_step(ctx->xp, EMA_WAIT_QUICK);
    return rma_in(ctx);
}

static void rma_noop_cb(void *request, ucs_status_t status, void *user_data)
{
}

static void rma_agg_cb(void *request, ucs_status_t status, void *user_data)
{
    ucp_request_free(request);
    ema__win_rma_agg_done(user_data, status);
}

struct ema_request *ema__win_rma_agg_new(ema__xport_t *xp, int size)
{
    struct ema_request *agg = calloc(1, sizeof(*agg) + (size_t)size * sizeof(struct ema_req_slot));
    if (agg == NULL) {
        return NULL;
    }
    /* the slots zeroed: no operation to any rank yet (agg set on the first) */
    agg->magic = EMA_REQ_MAGIC_AGG;
    agg->xp    = xp;
    atomic_init(&agg->status, EMA_SUCCESS);
    atomic_init(&agg->pending, 1); /* held until every run is issued */
    return agg;
}

void ema__win_rma_agg_done(struct ema_req_slot *slot, ucs_status_t status)
{
    struct ema_request *agg = slot->agg;
    if (status != UCS_OK) {
        int expected = EMA_SUCCESS;
        atomic_compare_exchange_strong(&agg->status, &expected, ema__xport_status(status));
    }
    atomic_fetch_sub(&slot->pending, 1);
    /* the last touch of agg, unless it was given up and this is the last
     * operation: then this frees it (rma_req_give_up) */
    if (atomic_fetch_sub(&agg->pending, 1) == EMA_REQ_ORPHAN + 1) {
        free(agg);
    }
}

static inline ucs_status_ptr_t rma_issue(ema__win_ctx_t *ctx, ema_op_t op, int rank,
                                         int tier, void *buf, size_t len, uint64_t raddr,
                                         const ucp_request_param_t *param)
{
    ucp_ep_h ep     = ctx->xp->eps[rank];
    ucp_rkey_h rkey = ema__xport_mr_rkey(&ctx->mr[tier], rank, raddr);
    return (op == EMA_OP_PUT) ? ucp_put_nbx(ep, buf, len, raddr, rkey, param)
                              : ucp_get_nbx(ep, buf, len, raddr, rkey, param);
}

/*
 * Resolve the run at @offset with ctx->inflight raised, waiting while its
 * segment moves.  Returns the run's length, the caller then issues the
 * operation and drops inflight; or 0, inflight dropped, if the range has
 * left the part (a shrink raced the operation), or is lost (*@rank_p -1:
 * see rma_fail).
 */
/* Why rma_enter found no run: the range is lost with a rank, or gone. */
static inline ema_status_t rma_fail(int trank)
{
    return (trank < 0) ? EMA_ERR_PEER_LOST : EMA_ERR_RANGE;
}

static inline size_t rma_enter(ema_win_h win, ema__win_part_t *part, size_t offset,
                               size_t len, int *rank_p, int *tier_p, uint64_t *raddr_p,
                               int *ep_p)
{
    ema__win_ctx_t *ctx = win->ctx;
    size_t n;
    int ep = rma_in(ctx);

    while ((n = rma_run(win, part, offset, len, rank_p, tier_p, raddr_p)) == 0) {
        ep = rma_wait_moving(ctx, ep);
    }
    if (n == SIZE_MAX || n == EMA_RUN_LOST) {
        rma_leave(ctx, ep);
        *rank_p = (n == EMA_RUN_LOST) ? -1 : 0;
        return 0;
    }
    *ep_p = ep;
    return n;
}

/* Direct access (host kind): the run's bytes are copied with the CPU into
 * or out of the holder's memory, mapped in this process. */
static inline char *rma_local(ema__win_ctx_t *ctx, int rank, int tier, uint64_t raddr)
{
    return ctx->peer_base[tier][rank] + (raddr - ctx->mr[tier].bases[rank]);
}

static ema_status_t rma_direct(ema_win_h win, ema_op_t op, int rank, size_t offset,
                               void *buf, size_t len)
{
    ema__win_ctx_t *ctx   = win->ctx;
    ema__win_part_t *part = &win->parts[rank];
    int trank, tier, ep;
    uint64_t raddr;
    size_t n;

    while (len > 0) {
        /* inflight covers the copy: a migration waits for it to finish */
        n = rma_enter(win, part, offset, len, &trank, &tier, &raddr, &ep);
        if (n == 0) {
            return rma_fail(trank);
        }
        char *p = rma_local(ctx, trank, tier, raddr);
        if (op == EMA_OP_PUT) {
            memcpy(p, buf, n);
        } else {
            memcpy(buf, p, n);
        }
        rma_leave(ctx, ep);
        buf = (char *)buf + n;
        offset += n;
        len -= n;
    }
    return EMA_SUCCESS;
}

/* Blocking: issue every run, then wait for all of them. */
static ema_status_t rma_blocking(ema_win_h win, ema_op_t op, int rank, size_t offset,
                                 void *buf, size_t len)
{
    if (win->ctx->direct) {
        return rma_direct(win, op, rank, offset, buf, len);
    }
    if (win->ctx->cpath.on) {
        return ema__win_rma_cdirect(win, op, rank, offset, buf, len);
    }
    ema__win_ctx_t *ctx = win->ctx;
    ema__win_part_t *part = &win->parts[rank];
    ucp_request_param_t param;
    ucs_status_ptr_t reqs[16];
    int rpeer[16]; /* the rank each request went to */
    ema_status_t status = EMA_SUCCESS, st;
    int nreqs = 0, trank, tier, ep;
    uint64_t raddr;
    /* ctx->put_flush: the one rank this put went to, whose flush goes with
     * it (-1: none yet; a put whose runs live on several ranks, rare, leaves
     * its flushes to ema_win_flush) */
    int fl_rank = -1, fl_ok = (op == EMA_OP_PUT && ctx->put_flush);

    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    param.cb.send      = rma_noop_cb;
    /* The whole operation counts as a wait: the progress thread leaves the
     * worker (and its lock) to this thread meanwhile. */
    ema__xport_app_enter(ctx->xp);
    while (len > 0) {
        size_t n = rma_enter(win, part, offset, len, &trank, &tier, &raddr, &ep);
        if (n == 0) {
            status = rma_fail(trank);
            break;
        }
        ucs_status_ptr_t sp = rma_issue(ctx, op, trank, tier, buf, n, raddr, &param);
        if (op == EMA_OP_PUT) {
            rma_issued(ctx, trank, ep); /* complete at the target after a flush */
            fl_ok   = fl_ok && (fl_rank < 0 || fl_rank == trank);
            fl_rank = trank;
        } else {
            rma_leave(ctx, ep); /* complete when it returns */
        }
        if (UCS_PTR_IS_ERR(sp)) {
            st = ema__xport_wait_req(ctx->xp, sp, trank,
                                     op == EMA_OP_PUT ? "ucp_put_nbx" : "ucp_get_nbx");
            status = (status == EMA_SUCCESS) ? st : status;
            break;
        }
        if (sp != NULL) {
            if (nreqs == (int)(sizeof(reqs) / sizeof(reqs[0]))) {
                st     = ema__xport_wait_req(ctx->xp, reqs[0], rpeer[0], "ucp rma");
                status = (status == EMA_SUCCESS) ? st : status;
                memmove(reqs, reqs + 1, sizeof(reqs[0]) * (size_t)(--nreqs));
                memmove(rpeer, rpeer + 1, sizeof(rpeer[0]) * (size_t)nreqs);
            }
            rpeer[nreqs]  = trank;
            reqs[nreqs++] = sp;
        }
        buf = (char *)buf + n;
        offset += n;
        len -= n;
    }
    /* The target's flush, issued now and waited for with the puts: what
     * the count says was issued before it, it completes. */
    uint64_t fl_count = 0;
    fl_ok = fl_ok && fl_rank >= 0 && status == EMA_SUCCESS;
    if (fl_ok) {
        fl_count            = atomic_load(&ctx->issued[fl_rank]);
        ucs_status_ptr_t sp = ucp_ep_flush_nbx(ctx->xp->eps[fl_rank], &param);
        if (UCS_PTR_IS_ERR(sp) || nreqs == (int)(sizeof(reqs) / sizeof(reqs[0]))) {
            st     = ema__xport_wait_req(ctx->xp, sp, fl_rank, "ucp_ep_flush_nbx");
            status = (status == EMA_SUCCESS) ? st : status;
        } else if (sp != NULL) {
            rpeer[nreqs]  = fl_rank;
            reqs[nreqs++] = sp;
        }
    }
    for (int i = 0; i < nreqs; i++) {
        st     = ema__xport_wait_req(ctx->xp, reqs[i], rpeer[i],
                                     op == EMA_OP_PUT ? "ucp_put_nbx or its flush"
                                                      : "ucp_get_nbx");
        status = (status == EMA_SUCCESS) ? st : status;
    }
    if (fl_ok && status == EMA_SUCCESS) {
        atomic_store(&ctx->flushed[fl_rank], fl_count);
    }
    ema__xport_app_leave(ctx->xp);
    return status;
}

static ema_status_t rma_nb(ema_win_h win, ema_op_t op, int rank, size_t offset, void *buf,
                           size_t len, ema_request_h *req_p)
{
    ema__win_ctx_t *ctx = win->ctx;
    ema__win_part_t *part = &win->parts[rank];
    ucp_request_param_t param;
    struct ema_request *agg = NULL;
    int trank, tier, ep = 0;
    uint64_t raddr;
    size_t n;

    if (len == 0) {
        *req_p = &ema_req_done;
        return EMA_SUCCESS;
    }
    if (ctx->direct || ctx->cpath.on) {
        /* a copy completes at once: the request is born complete (on the
         * cuda direct path too, see cuda_path.c) */
        ema_status_t status = ctx->direct ? rma_direct(win, op, rank, offset, buf, len)
                                          : ema__win_rma_cdirect(win, op, rank, offset, buf, len);
        if (status == EMA_SUCCESS) {
            *req_p = &ema_req_done;
        }
        return status;
    }
    n = rma_enter(win, part, offset, len, &trank, &tier, &raddr, &ep);
    if (n == 0) {
        return rma_fail(trank);
    }
    if (n == len) {
        /* one run: the UCX request is the handle */
        param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
        param.cb.send      = rma_noop_cb;
        ucs_status_ptr_t sp = rma_issue(ctx, op, trank, tier, buf, n, raddr, &param);
        rma_issued(ctx, trank, ep);
        if (sp == NULL) {
            *req_p = &ema_req_done;
            return EMA_SUCCESS;
        }
        if (UCS_PTR_IS_ERR(sp)) {
            return ema__xport_wait_req(ctx->xp, sp, trank,
                                       op == EMA_OP_PUT ? "ucp_put_nbx" : "ucp_get_nbx");
        }
        struct ema_request *req = sp;
        req->magic = EMA_REQ_MAGIC_UCX;
        req->xp    = ctx->xp;
        req->rank  = trank;
        *req_p     = req;
        return EMA_SUCCESS;
    }

    rma_leave(ctx, ep);
    agg = ema__win_rma_agg_new(ctx->xp, ctx->size);
    if (agg == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
    param.cb.send      = rma_agg_cb;
    while (len > 0) {
        n = rma_enter(win, part, offset, len, &trank, &tier, &raddr, &ep);
        if (n == 0) {
            int expected = EMA_SUCCESS;
            atomic_compare_exchange_strong(&agg->status, &expected, rma_fail(trank));
            break;
        }
        struct ema_req_slot *slot = &ema__req_slots(agg)[trank];
        slot->agg       = agg;
        param.user_data = slot;
        atomic_fetch_add(&slot->pending, 1);
        atomic_fetch_add(&agg->pending, 1);
        ucs_status_ptr_t sp = rma_issue(ctx, op, trank, tier, buf, n, raddr, &param);
        rma_issued(ctx, trank, ep);
        if (sp == NULL || UCS_PTR_IS_ERR(sp)) {
            if (UCS_PTR_IS_ERR(sp)) {
                ema_error("%s failed: %s", op == EMA_OP_PUT ? "ucp_put_nbx" : "ucp_get_nbx",
                          ucs_status_string(UCS_PTR_STATUS(sp)));
                int expected = EMA_SUCCESS;
                atomic_compare_exchange_strong(&agg->status, &expected,
                                               ema__xport_status(UCS_PTR_STATUS(sp)));
            }
            atomic_fetch_sub(&slot->pending, 1);
            atomic_fetch_sub(&agg->pending, 1);
        }
        buf = (char *)buf + n;
        offset += n;
        len -= n;
    }
    atomic_fetch_sub(&agg->pending, 1);
    *req_p = agg;
    return EMA_SUCCESS;
}

EMA_EXPORT ema_status_t ema_put(ema_win_h win, int rank, size_t offset, const void *buf,
                                size_t len)
{
    ema_status_t status = rma_check(win, rank, offset, buf, len);
    if (status != EMA_SUCCESS || len == 0) {
        return status;
    }
    return rma_blocking(win, EMA_OP_PUT, rank, offset, (void *)buf, len);
}

EMA_EXPORT ema_status_t ema_get(ema_win_h win, int rank, size_t offset, void *buf, size_t len)
{
    ema_status_t status = rma_check(win, rank, offset, buf, len);
    if (status != EMA_SUCCESS || len == 0) {
        return status;
    }
    return rma_blocking(win, EMA_OP_GET, rank, offset, buf, len);
}

/* The non-blocking forms: the same checks, then the operation. */
static ema_status_t rma_nb_checked(ema_win_h win, ema_op_t op, int rank, size_t offset,
                                   void *buf, size_t len, ema_request_h *req_p)
{
    ema_status_t status = rma_check(win, rank, offset, buf, len);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (req_p == NULL) {
        return EMA_ERR_INVALID_PARAM;
    }
    return rma_nb(win, op, rank, offset, buf, len, req_p);
}

EMA_EXPORT ema_status_t ema_put_nb(ema_win_h win, int rank, size_t offset, const void *buf,
                                   size_t len, ema_request_h *req_p)
{
    return rma_nb_checked(win, EMA_OP_PUT, rank, offset, (void *)buf, len, req_p);
}

EMA_EXPORT ema_status_t ema_get_nb(ema_win_h win, int rank, size_t offset, void *buf,
                                   size_t len, ema_request_h *req_p)
{
    return rma_nb_checked(win, EMA_OP_GET, rank, offset, buf, len, req_p);
}

static ema_status_t rma_req_check(ema_request_h req)
{
    ema_status_t status = ema__check_ready();
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (!ema__handle_plausible(req) ||
        (req->magic != EMA_REQ_MAGIC_UCX && req->magic != EMA_REQ_MAGIC_AGG &&
         req->magic != EMA_REQ_MAGIC_DONE)) {
        return EMA_ERR_INVALID_HANDLE;
    }
    return EMA_SUCCESS;
}

/* Whether a rank that @req's operations went to is lost (@left 0); or
 * (@left 1) whether it has operations left and all of them go to lost
 * ranks. */
static int rma_req_lost(ema_request_h req, int left)
{
    ema__xport_t *xp = req->xp;
    int lost = 0;
    if (xp == NULL || atomic_load(&xp->nlost) == 0) {
        return 0;
    }
    if (req->magic == EMA_REQ_MAGIC_UCX) {
        return ema__xport_peer_lost(xp, req->rank);
    }
    struct ema_req_slot *slots = ema__req_slots(req);
    for (int r = 0; r < xp->size; r++) {
        if (left ? atomic_load(&slots[r].pending) == 0 : slots[r].agg == NULL) {
            continue;
        }
        if (ema__xport_peer_lost(xp, r)) {
            lost = 1;
        } else if (left) {
            return 0; /* one to a live rank is in flight */
        }
    }
    return lost;
}

/* Test once; on completion release the request and return its status:
 * EMA_ERR_PEER_LOST where a rank it went to is lost (ema(7) FAULTS). */
static ema_status_t rma_req_poll(ema_request_h req)
{
    ema_status_t status;

    switch (req->magic) {
    case EMA_REQ_MAGIC_DONE:
        return EMA_SUCCESS;
    case EMA_REQ_MAGIC_UCX: {
        ucs_status_t us = ucp_request_check_status(req);
        if (us == UCS_INPROGRESS) {
            return EMA_INPROGRESS;
        }
        status = ema__xport_status(us);
        if (rma_req_lost(req, 0)) {
            status = EMA_ERR_PEER_LOST;
        } else if (us != UCS_OK) {
            ema_error("non-blocking rma failed: %s", ucs_status_string(us));
        }
        req->magic = 0;
        ucp_request_free(req);
        return status;
    }
    default: /* aggregate */
        if (atomic_load_explicit(&req->pending, memory_order_acquire) > 0) {
            return EMA_INPROGRESS;
        }
        status = (ema_status_t)atomic_load(&req->status);
        if (rma_req_lost(req, 0)) {
            status = EMA_ERR_PEER_LOST;
        }
        req->magic = 0;
        free(req);
        return status;
    }
}

/*
 * An incomplete request whose operations left all go to lost ranks
 * (rma_req_lost(req, 1)): they
 * may never complete (an operation that needs the target's help, as UCX's
 * emulated RMA does, waits for it for ever).  Then the wait gives it up:
 * EMA_ERR_PEER_LOST, the handle released, the operations left to UCX.
 * Nothing is given up while an operation to a live rank is in flight: it
 * may still write the caller's buffer (a get).  A dead rank sends no more
 * data, so what is given up cannot write it either, except an operation
 * that UCX completes on its own (shared memory, cma): and those complete
 * before this is reached, or fail.  A UCX request is freed by UCX when it
 * completes (ucp_request_free); an aggregate by the last operation's
 * callback (EMA_REQ_ORPHAN in its count), or here if that came first.
 */
static ema_status_t rma_req_give_up(ema_request_h req)
{
    if (req->magic == EMA_REQ_MAGIC_UCX) {
        req->magic = 0;
        ucp_request_free(req);
    } else {
        req->magic = 0;
        if (atomic_fetch_add(&req->pending, EMA_REQ_ORPHAN) == 0) {
            free(req); /* its last operation completed meanwhile */
        }
    }
    return EMA_ERR_PEER_LOST;
}

EMA_EXPORT ema_status_t ema_test(ema_request_h req)
{
    ema_status_t status = rma_req_check(req);
    if (status != EMA_SUCCESS) {
        return status;
    }
    status = rma_req_poll(req);
    if (status == EMA_INPROGRESS) {
        ema__xport_t *xp = req->xp;
        ema__xport_app_enter(xp);
        ema__xport_progress(xp);
        ema__xport_peers_check(xp);
        ema__xport_app_leave(xp);
        status = rma_req_poll(req);
        if (status == EMA_INPROGRESS && rma_req_lost(req, 1)) {
            status = rma_req_give_up(req);
        }
    }
    return status;
}

/* A wait for a request: rma_req_poll releases it once complete, so its
 * status is kept here. */
typedef struct {
    ema_request_h req;
    ema_status_t  status;
} ema_req_wait_t;

static int ema_req_finished(void *arg)
{
    ema_req_wait_t *w = arg;
    w->status = rma_req_poll(w->req);
    if (w->status == EMA_INPROGRESS && rma_req_lost(w->req, 1)) {
        w->status = rma_req_give_up(w->req); /* only dead ranks left */
    }
    return w->status != EMA_INPROGRESS;
}

EMA_EXPORT ema_status_t ema_wait(ema_request_h req)
{
    ema_status_t status = rma_req_check(req);
    if (status != EMA_SUCCESS) {
        return status;
    }
    ema__xport_t *xp = req->xp; /* NULL for a request born complete */
    if ((status = rma_req_poll(req)) != EMA_INPROGRESS) {
        return status;
    }
    ema_req_wait_t w = {req, EMA_INPROGRESS};
    ema__xport_app_enter(xp);
    ema__xport_wait_until(xp, EMA_WAIT_XPORT, 0, ema_req_finished, &w);
    ema__xport_app_leave(xp);
    return w.status;
}

EMA_EXPORT ema_status_t ema_win_flush(ema_win_h win, int rank)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (rank < 0 || rank >= win->ctx->size) {
        return EMA_ERR_INVALID_RANK;
    }
    if (win->ctx->direct) {
        atomic_thread_fence(memory_order_seq_cst); /* copies are complete */
        return rma_peer_lost(win->ctx, rank) ? EMA_ERR_PEER_LOST : EMA_SUCCESS;
    }
    if (rma_peer_lost(win->ctx, rank)) {
        return EMA_ERR_PEER_LOST;
    }
    /* Flush the endpoint of every rank holding a segment of the part; the
     * common case is one rank, the owner.  Large worlds flush the worker. */
    ema__win_part_t *part = &win->parts[rank];
    uint32_t nsegs = atomic_load(&part->nsegs);
    uint64_t mask = 0;
    if (win->ctx->size > 64) {
        return ema__xport_flush(win->ctx->xp);
    }
    for (uint32_t i = 0; i < nsegs; i++) {
        mask |= 1ull << EMA_LOC_RANK(atomic_load_explicit(&part->loc[i], memory_order_relaxed));
    }
    if (nsegs == 0) {
        mask = 1ull << rank;
    }
    /* Only endpoints with operations issued since their last flush: the
     * count is read before the flush, so what it counts was issued before
     * the flush and is covered.  A racing flush may store an older count,
     * which costs one more flush later. */
    for (int r = 0; mask != 0; r++, mask >>= 1) {
        uint64_t issued = atomic_load(&win->ctx->issued[r]);
        if ((mask & 1) && issued != atomic_load(&win->ctx->flushed[r])) {
            status = ema__xport_flush_ep(win->ctx->xp, r);
            if (status != EMA_SUCCESS) {
                return status;
            }
            atomic_store(&win->ctx->flushed[r], issued);
        }
    }
    return EMA_SUCCESS;
}

EMA_EXPORT ema_status_t ema_win_flush_all(ema_win_h win)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (win->ctx->direct) {
        atomic_thread_fence(memory_order_seq_cst);
        return EMA_SUCCESS;
    }
    /* As ema_win_flush, with the count over all ranks */
    ema__win_ctx_t *ctx = win->ctx;
    uint64_t issued     = atomic_load(&ctx->issued_all);
    if (issued != atomic_load(&ctx->flushed_all)) {
        status = ema__xport_flush(ctx->xp);
        if (status == EMA_SUCCESS) {
            atomic_store(&ctx->flushed_all, issued);
        }
    }
    return status;
}

static ema_status_t rma_atomic(ema_win_h win, int rank, size_t offset, ucp_atomic_op_t op,
                               uint64_t value, uint64_t *reply)
{
    int ep;
    ema_status_t status = rma_check(win, rank, offset, reply, sizeof(uint64_t));
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (offset % sizeof(uint64_t)) {
        return EMA_ERR_ALIGNMENT;
    }
    ema__win_ctx_t *ctx = win->ctx;
    int trank, tier;
    uint64_t raddr;
    if (rma_enter(win, &win->parts[rank], offset, sizeof(uint64_t), &trank, &tier,
                  &raddr, &ep) == 0) {
        return rma_fail(trank);
    }

    if (ctx->direct) {
        /* CPU atomics on shared memory are atomic across processes */
        uint64_t *word = (uint64_t *)rma_local(ctx, trank, tier, raddr);
        if (op == UCP_ATOMIC_OP_ADD) {
            *reply = __atomic_fetch_add(word, value, __ATOMIC_SEQ_CST);
        } else { /* CSWAP: value is the compare value, *reply the new one */
            uint64_t expected = value;
            __atomic_compare_exchange_n(word, &expected, *reply, 0, __ATOMIC_SEQ_CST,
                                        __ATOMIC_SEQ_CST);
            *reply = expected;
        }
        rma_leave(ctx, ep);
        return EMA_SUCCESS;
    }
    if (ctx->amo_by_holder) {
        /* In flight until the holder answered: a migration of the word
         * waits for it (ema__win_inval_local). */
        status = (op == UCP_ATOMIC_OP_ADD)
                     ? ema__win_amo(ctx, trank, tier, raddr, 0, value, 0, reply)
                     : ema__win_amo(ctx, trank, tier, raddr, 1, value, *reply, reply);
        rma_leave(ctx, ep);
        return status;
    }
    ucp_request_param_t param;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_DATATYPE |
                         UCP_OP_ATTR_FIELD_REPLY_BUFFER;
    param.cb.send      = rma_noop_cb;
    param.datatype     = ucp_dt_make_contig(sizeof(uint64_t));
    param.reply_buffer = reply;
    ucs_status_ptr_t sp = ucp_atomic_op_nbx(ctx->xp->eps[trank], op, &value, 1, raddr,
                                            ema__xport_mr_rkey(&ctx->mr[tier], trank, raddr),
                                            &param);
    rma_leave(ctx, ep);
    return ema__xport_wait_req(ctx->xp, sp, trank, "ucp_atomic_op_nbx");
}

EMA_EXPORT ema_status_t ema_fetch_add(ema_win_h win, int rank, size_t offset, uint64_t value,
                                      uint64_t *old_p)
{
    uint64_t old = 0;
    ema_status_t status = rma_atomic(win, rank, offset, UCP_ATOMIC_OP_ADD, value, &old);
    if (status == EMA_SUCCESS && old_p != NULL) {
        *old_p = old;
    }
    return status;
}

EMA_EXPORT ema_status_t ema_compare_swap(ema_win_h win, int rank, size_t offset,
                                         uint64_t compare, uint64_t value, uint64_t *old_p)
{
    /* UCX CSWAP: the operand is the value compared with; the reply buffer
     * holds the value to swap in, and on return the previous value. */
    uint64_t old = value;
    ema_status_t status = rma_atomic(win, rank, offset, UCP_ATOMIC_OP_CSWAP, compare, &old);
    if (status == EMA_SUCCESS && old_p != NULL) {
        *old_p = old;
    }
    return status;
}
