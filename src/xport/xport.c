/*
 * The UCX transport's lifecycle: the context, the worker and an endpoint to
 * every peer, and what UCX chose for them (for ema_info).  Active messages
 * and requests are in am.c, registration in mr.c, the deferred jobs and the
 * wait primitive in sched.c, the live waiters in waiter.c, collectives in
 * coll.c.
 */
#define _GNU_SOURCE
#include "xport.h"

#include "util/config.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMA_XPORT_CFG(_f) offsetof(ema__xport_config_t, _f)

const ema_config_field_t ema__xport_config_table[] = {
    {"UCX_WAKEUP", "y",
     "let idle progress threads sleep on UCX's event fd instead of spinning",
     EMA_XPORT_CFG(wakeup), &ema__config_bool},
    {"UCX_PEER_ERRORS", "n",
     "create UCX endpoints with UCP_ERR_HANDLING_MODE_PEER, so UCX itself fails requests to a "
     "dead peer; UCX 1.13 then has no shared-memory transport (sysv, posix, cma) and uses "
     "tcp over loopback. Without it a dead peer is found by its process id",
     EMA_XPORT_CFG(peer_errors), &ema__config_bool},
    {"PEER_TIMEOUT", "0",
     "seconds a peer may leave a request unanswered (a borrow, a table, an atomic, a UCX "
     "put, get or flush) before it counts as lost, as if it had died (0: no limit; a dead "
     "process is noticed within milliseconds either way); the loss is known to the rank "
     "that timed out alone (ema(7))",
     EMA_XPORT_CFG(peer_timeout), &ema__config_double},
    EMA_CONFIG_TABLE_END};

ema_status_t ema__xport_status(ucs_status_t status)
{
    switch (status) {
    case UCS_OK:                   return EMA_SUCCESS;
    case UCS_INPROGRESS:           return EMA_INPROGRESS;
    case UCS_ERR_NO_MEMORY:        return EMA_ERR_NO_MEMORY;
    case UCS_ERR_INVALID_PARAM:    return EMA_ERR_INVALID_PARAM;
    case UCS_ERR_UNSUPPORTED:      return EMA_ERR_UNSUPPORTED;
    case UCS_ERR_TIMED_OUT:        return EMA_ERR_TIMEOUT;
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT: return EMA_ERR_PEER_LOST;
    default:                       return EMA_ERR_TRANSPORT;
    }
}

static void ema_xport_describe(ema__xport_t *xp)
{
    /* Record the transports of an endpoint to a peer (or to self), as UCX
     * prints them, e.g. "posix/memory cma/memory". */
    char *buf = NULL;
    size_t blen = 0;
    int peer = (xp->size > 1) ? (xp->rank + 1) % xp->size : 0;
    FILE *f = open_memstream(&buf, &blen);

    xp->transports[0] = '\0';
    if (f == NULL) {
        return;
    }
    ucp_ep_print_info(xp->eps[peer], f);
    fclose(f);
    size_t n = 0;
    for (char *line = strtok(buf, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        char *lane = strstr(line, "lane[");
        if (lane == NULL) {
            continue;
        }
        /* the transport is the first token of the form tl/dev after ':' */
        char *colon = strchr(lane, ':');
        if (colon == NULL) {
            continue;
        }
        char tl[64];
        for (char *tok = colon + 1; *tok; tok++) {
            if (*tok == '/' && tok > colon + 1) {
                char *s = tok, *e = tok;
                while (s > colon + 1 && s[-1] != ' ' && s[-1] != '(' && s[-1] != ':') s--;
                while (*e && *e != ' ' && *e != ')' && *e != '.') e++;
                snprintf(tl, sizeof(tl), "%.*s", (int)(e - s), s);
                if (strstr(xp->transports, tl) == NULL &&
                    n + strlen(tl) + 2 < sizeof(xp->transports)) {
                    n += snprintf(xp->transports + n, sizeof(xp->transports) - n, "%s%s",
                                  n ? " " : "", tl);
                }
                break;
            }
        }
    }
    free(buf);
}

ema_status_t ema__xport_create(ema__xport_t *xp, int rank, int size)
{
    ucp_params_t params;
    ucp_worker_params_t wparams;
    ucp_worker_attr_t wattr;
    ucp_config_t *config;
    ucs_status_t status;
    ema_status_t est;

    xp->rank = rank;
    xp->size = size;
    xp->efd  = -1;
    ema__xport_coll_init(xp);
    ema__xport_sched_init(xp);
    ema__xport_waiters_init(xp);
    ema__xport_peers_init(xp);
    atomic_init(&xp->app_state, 0);
    atomic_init(&xp->am_closed, 0); /* an ema_init after an ema_finalize too */

    status = ucp_config_read(NULL, NULL, &config);
    if (status != UCS_OK) {
        ema_error("ucp_config_read failed: %s", ucs_status_string(status));
        return EMA_ERR_TRANSPORT;
    }
    memset(&params, 0, sizeof(params));
    params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                        UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_REQUEST_SIZE;
    params.request_size = xp->request_size;
    params.features   = UCP_FEATURE_RMA | UCP_FEATURE_AMO64 | UCP_FEATURE_AM;
    if (xp->cfg.wakeup) {
        params.features |= UCP_FEATURE_WAKEUP;
    }
    params.mt_workers_shared = 1;
    params.estimated_num_eps = (size_t)size;
    status = ucp_init(&params, config, &xp->context);
    ucp_config_release(config);
    if (status != UCS_OK) {
        ema_error("ucp_init failed: %s", ucs_status_string(status));
        return EMA_ERR_TRANSPORT;
    }

    memset(&wparams, 0, sizeof(wparams));
    wparams.field_mask  = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    wparams.thread_mode = UCS_THREAD_MODE_MULTI;
    status = ucp_worker_create(xp->context, &wparams, &xp->worker);
    if (status != UCS_OK) {
        ema_error("ucp_worker_create failed: %s", ucs_status_string(status));
        est = EMA_ERR_TRANSPORT;
        goto err_cleanup;
    }
    wattr.field_mask = UCP_WORKER_ATTR_FIELD_THREAD_MODE;
    if (ucp_worker_query(xp->worker, &wattr) == UCS_OK &&
        wattr.thread_mode != UCS_THREAD_MODE_MULTI) {
        ema_error("this UCX has no multi-thread support (built without --enable-mt)");
        est = EMA_ERR_UNSUPPORTED;
        goto err_worker;
    }
    status = ucp_worker_get_address(xp->worker, &xp->address, &xp->address_len);
    if (status != UCS_OK) {
        ema_error("ucp_worker_get_address failed: %s", ucs_status_string(status));
        est = EMA_ERR_TRANSPORT;
        goto err_worker;
    }
    if (xp->cfg.wakeup) {
        status = ucp_worker_get_efd(xp->worker, &xp->efd);
        if (status != UCS_OK) {
            ema_warn("ucp_worker_get_efd failed: %s; the progress thread will poll",
                     ucs_status_string(status));
            xp->efd = -1;
        }
    }
    xp->eps = calloc((size_t)size, sizeof(*xp->eps));
    if (xp->eps == NULL) {
        est = EMA_ERR_NO_MEMORY;
        goto err_address;
    }
    ema__xport_set_am_handler(xp, EMA_AM_COLL, ema__xport_coll_am, xp);
    return EMA_SUCCESS;

err_address:
    ucp_worker_release_address(xp->worker, xp->address);
err_worker:
    ucp_worker_destroy(xp->worker);
err_cleanup:
    ucp_cleanup(xp->context);
    xp->context = NULL;
    return est;
}

/* UCX found the endpoint to a peer failed (UCP_ERR_HANDLING_MODE_PEER):
 * its requests complete with an error; the rank is lost. */
static void ema_xport_ep_error(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    ema__xport_t *xp = ema__xport_am_self[EMA_AM_COLL];
    int peer = (int)(intptr_t)arg;
    (void)ep;
    if (xp != NULL && !xp->closing) {
        ema__xport_mark_lost(xp, peer, ucs_status_string(status));
    }
}

ema_status_t ema__xport_connect(ema__xport_t *xp, void *const *addrs)
{
    ucp_ep_params_t ep_params;
    ucs_status_t status;

    for (int r = 0; r < xp->size; r++) {
        memset(&ep_params, 0, sizeof(ep_params));
        ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        ep_params.address    = (const ucp_address_t *)addrs[r];
        if (r != xp->rank && xp->cfg.peer_errors) {
            /* a peer's death fails its requests instead of hanging them */
            ep_params.field_mask |= UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
            ep_params.err_mode       = UCP_ERR_HANDLING_MODE_PEER;
            ep_params.err_handler.cb  = ema_xport_ep_error;
            ep_params.err_handler.arg = (void *)(intptr_t)r;
        }
        status = ucp_ep_create(xp->worker, &ep_params, &xp->eps[r]);
        if (status != UCS_OK) {
            ema_error("ucp_ep_create to rank %d failed: %s", r, ucs_status_string(status));
            return EMA_ERR_TRANSPORT;
        }
    }
    ema_xport_describe(xp);
    ema_debug("ucx transports to peers: %s", xp->transports);
    return EMA_SUCCESS;
}

void ema__xport_destroy(ema__xport_t *xp)
{
    ucp_request_param_t param;

    if (xp->context == NULL) {
        return;
    }
    xp->closing = 1; /* peers that finished first are not lost */
    for (int r = 0; xp->eps != NULL && r < xp->size; r++) {
        if (xp->eps[r] == NULL) {
            continue;
        }
        param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        param.flags        = UCP_EP_CLOSE_FLAG_FORCE;
        ucs_status_ptr_t sp = ucp_ep_close_nbx(xp->eps[r], &param);
        if (sp != NULL && !UCS_PTR_IS_ERR(sp)) {
            while (ucp_request_check_status(sp) == UCS_INPROGRESS) {
                ucp_worker_progress(xp->worker);
            }
            ucp_request_free(sp);
        }
    }
    free(xp->eps);
    xp->eps = NULL;
    for (unsigned id = 0; id < EMA_AM_MAX; id++) {
        if (ema__xport_am_self[id] == xp) {
            ema__xport_am_self[id] = NULL;
        }
    }
    ucp_worker_release_address(xp->worker, xp->address);
    ucp_worker_destroy(xp->worker);
    ucp_cleanup(xp->context);
    xp->context = NULL;
    ema__xport_coll_cleanup(xp);
    ema__xport_sched_cleanup(xp);
    ema__xport_waiters_cleanup(xp);
    ema__xport_peers_cleanup(xp);
}

