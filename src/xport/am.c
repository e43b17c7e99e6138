/*
 * Active messages and UCX requests: the one prologue every control message
 * goes through (whole and eager, the sender's rank as the UCP header; then
 * ema__xport_am_dispatch: the id, a sender in the world and not this rank,
 * an aligned payload), sending with a wait for local completion, and
 * flushes.  A transport without a UCX worker (the fuzz harness's world,
 * tests/fuzz) keeps only the dispatch: sends go to xp->send_hook, flushes
 * complete at once.
 */
#include "xport.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every AM carries the sender's rank as its UCP header.  The handler's arg is
 * the address of this id's cell in ema__xport_am_self, which gives both the id
 * and the xport. */
ema__xport_t *ema__xport_am_self[EMA_AM_MAX];

__thread unsigned ema__xport_app_depth;

void ema__xport_am_dispatch(ema__xport_t *xp, unsigned id, int32_t src, const void *data,
                            size_t len)
{
    void *copy = NULL;

    if (atomic_load(&xp->am_closed)) {
        return; /* finalizing: late traffic of a peer (ema__xport_am_close) */
    }
    if (id >= EMA_AM_MAX || xp->am[id].cb == NULL) {
        ema_malformed("active message on id %u, which has no handler: dropped", id);
        return;
    }
    if (src < 0 || src >= xp->size || src == xp->rank) {
        ema_malformed("active message on id %u from rank %d, not a peer in the world of %d: "
                      "dropped", id, (int)src, xp->size);
        return;
    }
    if (((uintptr_t)data & (sizeof(uint64_t) - 1)) != 0 && len > 0) {
        /* The handlers read their payloads as arrays of 32- and 64-bit
         * words: give them an aligned copy where UCX did not. */
        copy = malloc(len);
        if (copy == NULL) {
            ema_error("out of memory receiving an active message on id %u", id);
            return;
        }
        memcpy(copy, data, len);
        data = copy;
    }
    xp->am[id].cb(xp->am[id].arg, src, data, len);
    free(copy);
}

static ucs_status_t ema_xport_am_cb(void *arg, const void *header, size_t header_length,
                                    void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ema__xport_t **cell = arg;
    ema__xport_t *xp    = *cell;
    unsigned id         = (unsigned)(cell - ema__xport_am_self);
    int32_t src;

    if (header_length != sizeof(src) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        /* Control traffic is always sent eager, with the sender's rank as
         * its header; anything else is a bug, or not ours. */
        ema_malformed("unexpected active message (header %zu bytes, flags 0x%lx) on id %u: "
                      "dropped", header_length, (unsigned long)param->recv_attr, id);
        return UCS_OK;
    }
    memcpy(&src, header, sizeof(src));
    if (xp != NULL) {
        ema__xport_am_dispatch(xp, id, src, data, length);
    }
    return UCS_OK;
}

void ema__xport_am_close(ema__xport_t *xp)
{
    atomic_store(&xp->am_closed, 1);
}

void ema__xport_set_am_handler(ema__xport_t *xp, unsigned id, ema__am_handler_cb cb, void *arg)
{
    ucp_am_handler_param_t p;

    xp->am[id].cb  = cb;
    xp->am[id].arg = arg;
    if (xp->worker == NULL) {
        return; /* a transport without UCX (tests/fuzz): ema__xport_am_dispatch only */
    }
    ema__xport_am_self[id] = xp;

    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    p.id    = id;
    p.cb    = ema_xport_am_cb;
    p.arg   = &ema__xport_am_self[id];
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucp_worker_set_am_recv_handler(xp->worker, &p);
}

static void ema_xport_send_cb(void *request, ucs_status_t status, void *user_data)
{
}

static int ema_xport_request_done(void *sp)
{
    return ucp_request_check_status(sp) != UCS_INPROGRESS;
}

ema_status_t ema__xport_wait_req(ema__xport_t *xp, ucs_status_ptr_t sp, int peer,
                                 const char *what)
{
    ucs_status_t status;

    if (sp == NULL) {
        return EMA_SUCCESS;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        status = UCS_PTR_STATUS(sp);
        if (peer < 0 || !ema__xport_peer_lost(xp, peer)) {
            ema_error("%s failed: %s", what, ucs_status_string(status));
        }
        return ema__xport_status(status);
    }
    /* the one wait on a peer: ends when @peer (-1: any rank) is lost, or
     * after EMA_PEER_TIMEOUT */
    ema__xport_app_enter(xp);
    (void)ema__xport_wait_peer(xp, EMA_WAIT_XPORT, peer, ema_xport_request_done, sp);
    status = ucp_request_check_status(sp);
    ema__xport_app_leave(xp);
    /* a request left to a lost peer is freed when UCX completes it (an
     * error, or the endpoint's teardown) */
    ucp_request_free(sp);
    if (status == UCS_INPROGRESS) {
        return EMA_ERR_PEER_LOST;
    }
    if (status != UCS_OK) {
        if (peer < 0 || !ema__xport_peer_lost(xp, peer)) {
            ema_error("%s failed: %s", what, ucs_status_string(status));
        }
        return (peer >= 0 && ema__xport_peer_lost(xp, peer)) ? EMA_ERR_PEER_LOST
                                                              : ema__xport_status(status);
    }
    return EMA_SUCCESS;
}

ema_status_t ema__xport_wait(ema__xport_t *xp, ucs_status_ptr_t sp, const char *what)
{
    return ema__xport_wait_req(xp, sp, -1, what);
}

ema_status_t ema__xport_am_send(ema__xport_t *xp, int peer, unsigned id, const void *hdr,
                                size_t hdr_len, const void *data, size_t len)
{
    int32_t src = xp->rank;
    ucp_request_param_t param;
    ucp_dt_iov_t iov[2] = {{(void *)hdr, hdr_len}, {(void *)data, len}};

    if (xp->send_hook != NULL) {
        return xp->send_hook(xp->send_hook_arg, peer, id, hdr, hdr_len, data, len);
    }
    if (ema__xport_peer_lost(xp, peer)) {
        return EMA_ERR_PEER_LOST;
    }

    /* The two parts go as one gathered message: the receiver sees them
     * contiguous (UCP_AM_FLAG_WHOLE_MSG), with no copy into a bounce buffer
     * here.  The UCP header, our rank, lives on our stack: we wait. */
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS | UCP_OP_ATTR_FIELD_CALLBACK |
                         UCP_OP_ATTR_FIELD_DATATYPE;
    param.flags        = UCP_AM_SEND_FLAG_EAGER;
    param.cb.send      = ema_xport_send_cb;
    param.datatype     = ucp_dt_make_iov();
    ucs_status_ptr_t sp = ucp_am_send_nbx(xp->eps[peer], id, &src, sizeof(src), iov,
                                          (len > 0) ? 2 : 1, &param);
    return ema__xport_wait_req(xp, sp, peer, "ucp_am_send_nbx");
}

ema_status_t ema__xport_flush_ep(ema__xport_t *xp, int peer)
{
    ucp_request_param_t param;
    if (xp->worker == NULL) {
        return EMA_SUCCESS; /* no UCX (tests/fuzz): nothing in flight */
    }
    if (ema__xport_peer_lost(xp, peer)) {
        return EMA_ERR_PEER_LOST;
    }
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    param.cb.send      = ema_xport_send_cb;
    /* held from the issue on: the flush takes the worker's lock too */
    ema__xport_app_enter(xp);
    ema_status_t status = ema__xport_wait_req(xp, ucp_ep_flush_nbx(xp->eps[peer], &param),
                                              peer, "ucp_ep_flush_nbx");
    ema__xport_app_leave(xp);
    return status;
}

ema_status_t ema__xport_flush(ema__xport_t *xp)
{
    ucp_request_param_t param;
    if (xp->worker == NULL) {
        return EMA_SUCCESS; /* no UCX (tests/fuzz): nothing in flight */
    }
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    param.cb.send      = ema_xport_send_cb;
    ema_status_t status = EMA_ERR_PEER_LOST;
    ema__xport_app_enter(xp);
    if (atomic_load(&xp->nlost) == 0) {
        status = ema__xport_wait(xp, ucp_worker_flush_nbx(xp->worker, &param),
                                 "ucp_worker_flush_nbx");
    }
    if (status == EMA_ERR_PEER_LOST) {
        /* A lost peer's endpoint may never flush: flush the live ones. */
        status = EMA_SUCCESS;
        for (int r = 0; r < xp->size; r++) {
            if (r != xp->rank && !ema__xport_peer_lost(xp, r)) {
                ema_status_t st = ema__xport_flush_ep(xp, r);
                status = (status == EMA_SUCCESS && st != EMA_ERR_PEER_LOST) ? st : status;
            }
        }
    }
    ema__xport_app_leave(xp);
    return status;
}

