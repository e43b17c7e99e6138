#define _GNU_SOURCE
#include "xport.h"

#include "util/config.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMA_XPORT_CFG(_f) offsetof(ema__xport_config_t, _f)

const ema_config_field_t ema__xport_config_table[] = {
    {"UCX_WAKEUP", "y",
     "let idle progress threads sleep on UCX's event fd instead of spinning",
     EMA_XPORT_CFG(wakeup), &ema__config_bool},
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

void ema__xport_idle(ema__xport_t *xp)
{
    /* Spin a while before giving the core away: a yield is a system call,
     * and a waiter that yields at every empty poll hands its core to the
     * progress thread, which then contends for the worker. */
    static __thread unsigned spins;
    if ((++spins & xp->idle_mask) == 0) {
        sched_yield();
    }
}

/*
 * How often a waiter yields (see ema__xport_idle).  Where the ranks and
 * their progress threads outnumber the cores this process may run on, the
 * peer a waiter waits for may need its core: yield every 64 empty polls.
 * Where each has a core, a yield only adds a system call to the wait (a
 * blocking put of 2 MiB over cuda_ipc polls UCX some 60 times, so it made
 * about one yield per operation; on the H200 removing it changed nothing
 * measurable, within the launch-to-launch noise).  Then yield every 4096
 * empty polls, which still lets a stray thread run now and then.  The
 * cores are those of the affinity mask, fewer if a CPU quota grants fewer.
 */
/* The CPUs a CFS quota grants (a container's --cpus), rounded up; 0 when
 * there is none or it cannot be read (cgroup v2 cpu.max, else v1). */
static long ema_xport_quota_cpus(void)
{
    long long quota = -1, period = 0;
    char word[32];
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");

    if (f != NULL) {
        if (fscanf(f, "%31s %lld", word, &period) == 2 && strcmp(word, "max") != 0) {
            quota = atoll(word);
        }
        fclose(f);
    } else if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r")) != NULL) {
        if (fscanf(f, "%lld", &quota) != 1) {
            quota = -1;
        }
        fclose(f);
        if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r")) != NULL) {
            if (fscanf(f, "%lld", &period) != 1) {
                period = 0;
            }
            fclose(f);
        }
    }
    return (quota > 0 && period > 0) ? (long)((quota + period - 1) / period) : 0;
}

static unsigned ema_xport_idle_mask(int size)
{
    cpu_set_t set;
    long cpus = 0, quota = ema_xport_quota_cpus();

    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        cpus = CPU_COUNT(&set);
    }
    if (quota > 0 && (cpus == 0 || quota < cpus)) {
        cpus = quota;
    }
    unsigned mask = (cpus > 0 && 2L * size <= cpus) ? 4095u : 63u;
    ema_debug("%ld cores for %d ranks and their progress threads: waiters yield every %u "
              "empty polls", cpus, size, mask + 1);
    return mask;
}

/* Every AM carries the sender's rank as its UCP header.  The handler's arg is
 * the address of this id's cell in ema_xport_am_self, which gives both the id
 * and the xport. */
static ema__xport_t *ema_xport_am_self[EMA_AM_MAX];

__thread unsigned ema__xport_app_depth;

static ucs_status_t ema_xport_am_cb(void *arg, const void *header, size_t header_length,
                                    void *data, size_t length, const ucp_am_recv_param_t *param)
{
    ema__xport_t **cell = arg;
    ema__xport_t *xp    = *cell;
    unsigned id         = (unsigned)(cell - ema_xport_am_self);
    int32_t src;

    if (header_length != sizeof(src) || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV)) {
        /* Control traffic is always sent eager; anything else is a bug. */
        ema_error("unexpected active message (header %zu bytes, flags 0x%lx) on id %u",
                  header_length, (unsigned long)param->recv_attr, id);
        return UCS_OK;
    }
    memcpy(&src, header, sizeof(src));
    if (xp != NULL && xp->am[id].cb != NULL) {
        xp->am[id].cb(xp->am[id].arg, src, data, length);
    }
    return UCS_OK;
}

void ema__xport_set_am_handler(ema__xport_t *xp, unsigned id, ema__am_handler_cb cb, void *arg)
{
    ucp_am_handler_param_t p;

    xp->am[id].cb  = cb;
    xp->am[id].arg = arg;
    ema_xport_am_self[id] = xp;

    memset(&p, 0, sizeof(p));
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB |
                   UCP_AM_HANDLER_PARAM_FIELD_ARG | UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    p.id    = id;
    p.cb    = ema_xport_am_cb;
    p.arg   = &ema_xport_am_self[id];
    p.flags = UCP_AM_FLAG_WHOLE_MSG;
    ucp_worker_set_am_recv_handler(xp->worker, &p);
}

static void ema_xport_send_cb(void *request, ucs_status_t status, void *user_data)
{
}

ema_status_t ema__xport_wait(ema__xport_t *xp, ucs_status_ptr_t sp, const char *what)
{
    ucs_status_t status;

    if (sp == NULL) {
        return EMA_SUCCESS;
    }
    if (UCS_PTR_IS_ERR(sp)) {
        status = UCS_PTR_STATUS(sp);
        ema_error("%s failed: %s", what, ucs_status_string(status));
        return ema__xport_status(status);
    }
    ema__xport_app_enter(xp);
    while ((status = ucp_request_check_status(sp)) == UCS_INPROGRESS) {
        if (ucp_worker_progress(xp->worker) == 0) {
            ema__xport_idle(xp);
        }
    }
    ema__xport_app_leave(xp);
    ucp_request_free(sp);
    if (status != UCS_OK) {
        ema_error("%s failed: %s", what, ucs_status_string(status));
        return ema__xport_status(status);
    }
    return EMA_SUCCESS;
}

ema_status_t ema__xport_am_send(ema__xport_t *xp, int peer, unsigned id, const void *hdr,
                                size_t hdr_len, const void *data, size_t len)
{
    int32_t src = xp->rank;
    ucp_request_param_t param;
    ucp_dt_iov_t iov[2] = {{(void *)hdr, hdr_len}, {(void *)data, len}};

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
    return ema__xport_wait(xp, sp, "ucp_am_send_nbx");
}

static void ema_xport_step(ema__xport_t *xp, int quick_only)
{
    if (ema__xport_progress(xp) + (unsigned)ema__xport_run_deferred(xp, quick_only) == 0) {
        ema__xport_idle(xp);
    }
}

void ema__xport_wait_step(ema__xport_t *xp)
{
    ema_xport_step(xp, 1);
}

void ema__xport_wait_step_long(ema__xport_t *xp)
{
    ema_xport_step(xp, 0);
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
    xp->idle_mask = ema_xport_idle_mask(size);
    ema__xport_coll_init(xp);
    pthread_mutex_init(&xp->defer_lock, NULL);
    ema__xport_waiters_init(xp);
    atomic_init(&xp->app_state, 0);
    for (int q = 0; q < 2; q++) {
        xp->defer_head[q] = NULL;
        xp->defer_tail[q] = &xp->defer_head[q];
        atomic_init(&xp->defer_count[q], 0);
    }

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

ema_status_t ema__xport_connect(ema__xport_t *xp, void *const *addrs)
{
    ucp_ep_params_t ep_params;
    ucs_status_t status;

    for (int r = 0; r < xp->size; r++) {
        memset(&ep_params, 0, sizeof(ep_params));
        ep_params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS;
        ep_params.address    = (const ucp_address_t *)addrs[r];
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
        if (ema_xport_am_self[id] == xp) {
            ema_xport_am_self[id] = NULL;
        }
    }
    ucp_worker_release_address(xp->worker, xp->address);
    ucp_worker_destroy(xp->worker);
    ucp_cleanup(xp->context);
    xp->context = NULL;
    ema__xport_coll_cleanup(xp);
    for (int q = 0; q < 2; q++) {
        while (xp->defer_head[q] != NULL) {
            ema__defer_t *d   = xp->defer_head[q];
            xp->defer_head[q] = d->next;
            free(d->arg); /* deferred args are malloc'ed messages */
            free(d);
        }
    }
    pthread_mutex_destroy(&xp->defer_lock);
    ema__xport_waiters_cleanup(xp);
}

/*
 * Register [addr, addr+len) with UCX, as one region or, with @unit, as
 * len/unit regions of @unit bytes.  CUDA VMM memory needs the latter: UCX's
 * cuda_ipc exports one allocation per key (cuMemGetAddressRange), so a key
 * over an arena of many allocations reaches only the first, and UCX falls
 * back to staged copies for the rest.
 *
 * The packed form, sent to the peers, is [u32 nreg] then per region
 * [u32 len][rkey bytes].
 */
ema_status_t ema__xport_mr_register(ema__xport_t *xp, void *addr, size_t len, size_t unit,
                                    int cuda, ema__xport_mr_t *mr)
{
    ucp_mem_map_params_t mp;
    ucs_status_t status = UCS_OK;
    uint32_t nreg = (unit > 0) ? (uint32_t)(len / unit) : 1, i;
    void **bufs   = NULL;
    size_t *lens  = NULL;

    memset(mr, 0, sizeof(*mr));
    mr->unit  = (unit > 0) ? unit : len;
    mr->nreg  = nreg ? nreg : 1;
    mr->rkeys = calloc((size_t)xp->size, sizeof(*mr->rkeys));
    mr->bases = calloc((size_t)xp->size, sizeof(*mr->bases));
    mr->memh  = calloc(mr->nreg, sizeof(*mr->memh));
    bufs      = calloc(mr->nreg, sizeof(*bufs));
    lens      = calloc(mr->nreg, sizeof(*lens));
    if (mr->rkeys == NULL || mr->bases == NULL || mr->memh == NULL || bufs == NULL ||
        lens == NULL) {
        status = UCS_ERR_NO_MEMORY;
        goto err;
    }
    size_t total = sizeof(uint32_t);
    for (i = 0; i < mr->nreg; i++) {
        memset(&mp, 0, sizeof(mp));
        mp.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH;
        mp.address    = (char *)addr + (size_t)i * mr->unit;
        mp.length     = (mr->nreg > 1) ? mr->unit : len;
        if (cuda) {
            /* VMM memory mapped through driver calls that UCX does not
             * hook: say what it is rather than let UCX take it for host */
            mp.field_mask |= UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE;
            mp.memory_type = UCS_MEMORY_TYPE_CUDA;
        }
        status = ucp_mem_map(xp->context, &mp, &mr->memh[i]);
        if (status != UCS_OK) {
            ema_error("ucp_mem_map(%p, %zu) failed: %s", mp.address, mp.length,
                      ucs_status_string(status));
            goto err;
        }
        status = ucp_rkey_pack(xp->context, mr->memh[i], &bufs[i], &lens[i]);
        if (status != UCS_OK) {
            ema_error("ucp_rkey_pack failed: %s", ucs_status_string(status));
            goto err;
        }
        total += sizeof(uint32_t) + lens[i];
    }
    char *p = mr->rkey_buf = malloc(total);
    if (p == NULL) {
        status = UCS_ERR_NO_MEMORY;
        goto err;
    }
    mr->rkey_len = total;
    memcpy(p, &mr->nreg, sizeof(uint32_t));
    p += sizeof(uint32_t);
    for (i = 0; i < mr->nreg; i++) {
        uint32_t l = (uint32_t)lens[i];
        memcpy(p, &l, sizeof(l));
        memcpy(p + sizeof(l), bufs[i], lens[i]);
        p += sizeof(l) + lens[i];
        ucp_rkey_buffer_release(bufs[i]);
        bufs[i] = NULL;
    }
    free(bufs);
    free(lens);
    return EMA_SUCCESS;

err:
    for (i = 0; bufs != NULL && i < mr->nreg; i++) {
        if (bufs[i] != NULL) {
            ucp_rkey_buffer_release(bufs[i]);
        }
    }
    free(bufs);
    free(lens);
    ema__xport_mr_deregister(xp, mr);
    return ema__xport_status(status);
}

ema_status_t ema__xport_mr_add_peer(ema__xport_t *xp, ema__xport_mr_t *mr, int peer,
                                    uint64_t base, const void *rkey_buf, size_t rkey_len)
{
    const char *p = rkey_buf, *end = p + rkey_len;
    uint32_t nreg;

    if (rkey_len < sizeof(nreg)) {
        goto malformed;
    }
    memcpy(&nreg, p, sizeof(nreg));
    p += sizeof(nreg);
    if (nreg != mr->nreg) {
        ema_error("rank %d registered its memory as %u regions, this rank as %u: set "
                  "EMA_DEVICE_MEMORY and EMA_SEGMENT_SIZE alike on every rank", peer, nreg,
                  mr->nreg);
        return EMA_ERR_INVALID_PARAM;
    }
    mr->rkeys[peer] = calloc(nreg, sizeof(ucp_rkey_h));
    if (mr->rkeys[peer] == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    for (uint32_t i = 0; i < nreg; i++) {
        uint32_t l;
        if (p + sizeof(l) > end) {
            goto malformed;
        }
        memcpy(&l, p, sizeof(l));
        p += sizeof(l);
        if (p + l > end) {
            goto malformed;
        }
        ucs_status_t status = ucp_ep_rkey_unpack(xp->eps[peer], p, &mr->rkeys[peer][i]);
        if (status != UCS_OK) {
            ema_error("ucp_ep_rkey_unpack from rank %d failed: %s", peer,
                      ucs_status_string(status));
            return ema__xport_status(status);
        }
        p += l;
    }
    mr->bases[peer] = base;
    return EMA_SUCCESS;

malformed:
    ema_error("malformed memory keys from rank %d", peer);
    return EMA_ERR_BOOTSTRAP;
}

void ema__xport_mr_deregister(ema__xport_t *xp, ema__xport_mr_t *mr)
{
    for (int r = 0; mr->rkeys != NULL && r < xp->size; r++) {
        for (uint32_t i = 0; mr->rkeys[r] != NULL && i < mr->nreg; i++) {
            if (mr->rkeys[r][i] != NULL) {
                ucp_rkey_destroy(mr->rkeys[r][i]);
            }
        }
        free(mr->rkeys[r]);
    }
    for (uint32_t i = 0; mr->memh != NULL && i < mr->nreg; i++) {
        if (mr->memh[i] != NULL) {
            ucp_mem_unmap(xp->context, mr->memh[i]);
        }
    }
    free(mr->rkey_buf);
    free(mr->memh);
    free(mr->rkeys);
    free(mr->bases);
    memset(mr, 0, sizeof(*mr));
}

ema_status_t ema__xport_flush_ep(ema__xport_t *xp, int peer)
{
    ucp_request_param_t param;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    param.cb.send      = ema_xport_send_cb;
    /* held from the issue on: the flush takes the worker's lock too */
    ema__xport_app_enter(xp);
    ema_status_t status = ema__xport_wait(xp, ucp_ep_flush_nbx(xp->eps[peer], &param),
                                          "ucp_ep_flush_nbx");
    ema__xport_app_leave(xp);
    return status;
}

ema_status_t ema__xport_flush(ema__xport_t *xp)
{
    ucp_request_param_t param;
    param.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK;
    param.cb.send      = ema_xport_send_cb;
    ema__xport_app_enter(xp);
    ema_status_t status = ema__xport_wait(xp, ucp_worker_flush_nbx(xp->worker, &param),
                                          "ucp_worker_flush_nbx");
    ema__xport_app_leave(xp);
    return status;
}

void ema__xport_defer(ema__xport_t *xp, int quick, ema__defer_cb cb, void *arg)
{
    int q = quick ? 0 : 1;
    ema__defer_t *d = malloc(sizeof(*d));
    if (d == NULL) {
        ema_error("out of memory queueing deferred work; running it in place");
        cb(arg);
        return;
    }
    d->cb   = cb;
    d->arg  = arg;
    d->next = NULL;
    pthread_mutex_lock(&xp->defer_lock);
    *xp->defer_tail[q] = d;
    xp->defer_tail[q]  = &d->next;
    pthread_mutex_unlock(&xp->defer_lock);
    atomic_fetch_add(&xp->defer_count[q], 1);
    if (xp->efd >= 0) {
        ucp_worker_signal(xp->worker); /* wake a sleeping progress thread */
    }
}

static ema__defer_t *ema_xport_defer_pop(ema__xport_t *xp, int q)
{
    ema__defer_t *d;
    if (atomic_load_explicit(&xp->defer_count[q], memory_order_acquire) == 0) {
        return NULL;
    }
    pthread_mutex_lock(&xp->defer_lock);
    d = xp->defer_head[q];
    if (d != NULL) {
        xp->defer_head[q] = d->next;
        if (xp->defer_head[q] == NULL) {
            xp->defer_tail[q] = &xp->defer_head[q];
        }
        atomic_fetch_sub(&xp->defer_count[q], 1);
    }
    pthread_mutex_unlock(&xp->defer_lock);
    return d;
}

int ema__xport_run_deferred(ema__xport_t *xp, int quick_only)
{
    ema__defer_t *d;
    int n = 0;

    /* The quick jobs queued now, not those they queue: a job may put itself
     * back (see ema_win_in_amo in win/coherence.c). */
    int budget = atomic_load(&xp->defer_count[0]);
    while (budget-- > 0 && (d = ema_xport_defer_pop(xp, 0)) != NULL) {
        d->cb(d->arg);
        free(d);
        n++;
    }
    if (!quick_only && (d = ema_xport_defer_pop(xp, 1)) != NULL) {
        d->cb(d->arg); /* one long job per call, so quick ones are not starved */
        free(d);
        n++;
    }
    return n;
}
