#include "boot.h"

#include "util/clock.h"
#include "util/config.h"
#include "util/log.h"

#include <pmix.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EMA_BOOT_CFG(_f) offsetof(ema__boot_config_t, _f)
/* The one key of the exchange; a later ema_init's put replaces it. */
#define EMA_BOOT_KEY     "ema.modex"

const ema_config_field_t ema__boot_config_table[] = {
    {"BOOT_TIMEOUT", "60",
     "seconds a PMIx fence may take before ema_init fails (a peer that never starts); "
     "set it alike on every rank, as PMIx applies one value to the whole fence",
     EMA_BOOT_CFG(timeout), &ema__config_double},
    EMA_CONFIG_TABLE_END};

static pmix_proc_t ema_boot_proc;
/* PMIx stays initialised from the first ema_init that reached the server
 * until ema_finalize: a failed ema_init (a bad argument, an unusable
 * memory kind) leaves it up for the next try.  Taking PMIx down and up
 * again on every failed try broke later fences: after some tens of cycles
 * a valid ema_init failed with a bootstrap, timeout or transport error. */
static int ema_boot_pmix_up;
/* Set while PMIx is up with no world on it: after a failed ema_init.  A
 * process that then exits (a failed ema_init usually ends the program)
 * must still say goodbye to its launcher, or Open MPI's prterun aborts the
 * whole job ("called init but exited without calling finalize") and the
 * other ranks lose their output; and ema_finalize answers EMA_ERR_STATE
 * after a failed ema_init, so the program cannot.  boot_fini does it at
 * exit (or at dlclose of libema). */
static int ema_boot_idle;
/* When our PMIx_Init returned (ema__now_us), for boot_fini's settling. */
static double ema_boot_up_us;

/* How long after our own PMIx_Init an idle process waits before its
 * PMIx_Finalize.  A client that disconnects while a sibling is still in its
 * PMIx_Init handshake can leave that sibling in PMIx_Init for ever (Open
 * MPI 4.1 with PMIx 4.2, Debian 12): test_regress init_fail_exit, where
 * all 4 ranks fail ema_init and exit at once, hung one rank in 6 of 135
 * runs on the 2-core VM, and in 0 of 120 with 300 ms of sleep before the
 * finalize.  The siblings start with us, so this bounds the window in
 * which one may still be connecting; it costs only a failed ema_init's
 * exit, by at most this much. */
#define EMA_BOOT_SETTLE_US 300000.0

/* The launcher's word on lost processes (ema__boot_watch). */
static void (*_Atomic ema_boot_lost_cb)(void *arg, int rank);
static void *ema_boot_lost_arg;
static size_t ema_boot_evh;
static int ema_boot_evh_on;

/* A launcher that serves PMIx leaves these in the environment. */
static int boot_launched(void)
{
    return getenv("PMIX_NAMESPACE") || getenv("PMIX_SERVER_URI4") ||
           getenv("PMIX_SERVER_URI3") || getenv("PMIX_SERVER_URI2") ||
           getenv("PMIX_SERVER_URI21") || getenv("PMIX_SERVER_URI41");
}

/* A PMIx server URI reads "nspace.rank;tcp4://host:port" (or tcp6). */
static int boot_uri_wellformed(void)
{
    static const char *vars[] = {"PMIX_SERVER_URI41", "PMIX_SERVER_URI4", "PMIX_SERVER_URI3",
                                 "PMIX_SERVER_URI21", "PMIX_SERVER_URI2"};
    int seen = 0;
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *uri = getenv(vars[i]);
        if (uri == NULL) {
            continue;
        }
        seen = 1;
        const char *semi = strchr(uri, ';');
        if (semi != NULL && semi > uri && strstr(semi, "://") != NULL) {
            return 1;
        }
    }
    return !seen; /* no URI at all: let PMIx look for its server itself */
}

static int boot_get_u32(const pmix_proc_t *proc, const char *key, uint32_t *val_p)
{
    pmix_value_t *val = NULL;
    pmix_status_t rc = PMIx_Get(proc, key, NULL, 0, &val);
    if (rc != PMIX_SUCCESS || val == NULL) {
        return -1;
    }
    switch (val->type) {
    case PMIX_UINT32: *val_p = val->data.uint32; break;
    case PMIX_UINT16: *val_p = val->data.uint16; break;
    case PMIX_INT:    *val_p = (uint32_t)val->data.integer; break;
    case PMIX_PROC_RANK: *val_p = val->data.rank; break;
    default: PMIX_VALUE_RELEASE(val); return -1;
    }
    PMIX_VALUE_RELEASE(val);
    return 0;
}

ema_status_t ema__boot_init(ema__boot_t *boot)
{
    pmix_proc_t wild;
    uint32_t v;
    pmix_status_t rc;

    boot->rank       = 0;
    boot->size       = 1;
    boot->local_rank = 0;
    boot->local_size = 1;
    boot->singleton  = 1;
    strcpy(boot->nspace, "singleton");

    if (!boot_launched()) {
        /* No launcher: do not even try to reach a system PMIx server, so a
         * world of one starts at once. */
        ema_debug("no PMIx launcher in the environment: world of one");
        return EMA_SUCCESS;
    }

    if (!boot_uri_wellformed()) {
        /* libpmix would print its own internal error first: say it once */
        ema_error("the PMIx server address in the environment is malformed (PMIX_SERVER_URI*): "
                  "the launcher is broken or the variables were set by hand");
        return EMA_ERR_BOOTSTRAP;
    }
    if (!ema_boot_pmix_up) {
        rc = PMIx_Init(&ema_boot_proc, NULL, 0);
        if (rc != PMIX_SUCCESS) {
            ema_error("PMIx_Init failed: %s (started by a launcher whose PMIx server "
                      "cannot be reached)", PMIx_Error_string(rc));
            return EMA_ERR_BOOTSTRAP;
        }
        ema_boot_pmix_up = 1;
        ema_boot_up_us   = ema__now_us();
    }
    ema_boot_idle = 0;

    PMIX_PROC_CONSTRUCT(&wild);
    PMIX_LOAD_PROCID(&wild, ema_boot_proc.nspace, PMIX_RANK_WILDCARD);
    if (boot_get_u32(&wild, PMIX_JOB_SIZE, &v) != 0 || v == 0) {
        ema_error("PMIx_Get(PMIX_JOB_SIZE) failed");
        return EMA_ERR_BOOTSTRAP;
    }
    boot->size      = (int)v;
    boot->rank      = (int)ema_boot_proc.rank;
    boot->singleton = 0;
    snprintf(boot->nspace, sizeof(boot->nspace), "%s", ema_boot_proc.nspace);
    if (boot_get_u32(&ema_boot_proc, PMIX_LOCAL_RANK, &v) == 0) {
        boot->local_rank = (int)v;
    } else {
        boot->local_rank = boot->rank;
    }
    if (boot_get_u32(&wild, PMIX_LOCAL_SIZE, &v) == 0) {
        boot->local_size = (int)v;
    } else {
        boot->local_size = boot->size;
    }
    if (boot->local_size != boot->size) {
        /* EMA lends memory between the GPUs of one server. */
        ema_error("the job spans several nodes (%d of %d ranks are local): EMA runs on one "
                  "node", boot->local_size, boot->size);
        boot->singleton = 1;
        return EMA_ERR_UNSUPPORTED;
    }
    ema_debug("PMIx rank %d of %d in %s", boot->rank, boot->size, boot->nspace);
    return EMA_SUCCESS;
}

/* A PMIx event about a process: the one affected (PMIX_EVENT_AFFECTED_PROC),
 * else the source, when it is of this job. */
static void boot_event(size_t id, pmix_status_t status, const pmix_proc_t *source,
                       pmix_info_t info[], size_t ninfo, pmix_info_t *results, size_t nresults,
                       pmix_event_notification_cbfunc_fn_t cbfunc, void *cbdata)
{
    const pmix_proc_t *proc = source;
    void (*cb)(void *, int) = atomic_load(&ema_boot_lost_cb);
    (void)id;
    (void)results;
    (void)nresults;
    for (size_t i = 0; i < ninfo; i++) {
        if (PMIX_CHECK_KEY(&info[i], PMIX_EVENT_AFFECTED_PROC) &&
            info[i].value.type == PMIX_PROC && info[i].value.data.proc != NULL) {
            proc = info[i].value.data.proc;
        }
    }
    ema_debug("PMIx event %s about %s.%u", PMIx_Error_string(status),
              proc ? proc->nspace : "?", proc ? (unsigned)proc->rank : 0u);
    if (cb != NULL && proc != NULL && PMIX_CHECK_NSPACE(proc->nspace, ema_boot_proc.nspace) &&
        proc->rank != PMIX_RANK_WILDCARD && proc->rank != ema_boot_proc.rank) {
        cb(ema_boot_lost_arg, (int)proc->rank);
    }
    if (cbfunc != NULL) {
        cbfunc(PMIX_EVENT_ACTION_COMPLETE, NULL, 0, NULL, NULL, cbdata);
    }
}

void ema__boot_watch(ema__boot_t *boot, void (*cb)(void *arg, int rank), void *arg)
{
    pmix_status_t codes[] = {PMIX_ERR_PROC_ABORTED, PMIX_ERR_PROC_ABORTING,
                             PMIX_EVENT_PROC_TERMINATED};
    if (boot->singleton || !ema_boot_pmix_up || ema_boot_evh_on) {
        return;
    }
    ema_boot_lost_arg = arg;
    atomic_store(&ema_boot_lost_cb, cb);
    /* blocking form (no callback): the handler's reference, or an error */
    pmix_status_t rc = PMIx_Register_event_handler(codes, sizeof(codes) / sizeof(codes[0]),
                                                   NULL, 0, boot_event, NULL, NULL);
    if (rc < 0) {
        ema_debug("PMIx_Register_event_handler: %s; lost ranks are found by their pids only",
                  PMIx_Error_string(rc));
        return;
    }
    ema_boot_evh    = (size_t)rc;
    ema_boot_evh_on = 1;
}

void ema__boot_unwatch(ema__boot_t *boot)
{
    (void)boot;
    atomic_store(&ema_boot_lost_cb, NULL);
    if (ema_boot_evh_on && ema_boot_pmix_up) {
        PMIx_Deregister_event_handler(ema_boot_evh, NULL, NULL);
    }
    ema_boot_evh_on = 0;
}

void ema__boot_finalize(ema__boot_t *boot)
{
    if (ema_boot_pmix_up) {
        PMIx_Finalize(NULL, 0);
        ema_boot_pmix_up = 0;
    }
    boot->singleton = 1;
}

/* A destructor rather than atexit: it also runs when libema is unloaded
 * (a Python process that dlcloses it), where an atexit handler would
 * point into unmapped code.  libpmix, which libema needs, is torn down
 * after it.  A world still up at exit (no ema_finalize) is left alone. */
__attribute__((destructor)) static void boot_fini(void)
{
    if (ema_boot_pmix_up && ema_boot_idle) {
        double left_us = ema_boot_up_us + EMA_BOOT_SETTLE_US - ema__now_us();
        if (left_us > 0) {
            usleep((useconds_t)left_us); /* under 1 s */
        }
        PMIx_Finalize(NULL, 0);
        ema_boot_pmix_up = 0;
        ema_boot_idle    = 0;
    }
}

/* Whether a fence failed because a participant left the job (PMIx's codes
 * for it vary with the version and the server). */
static int boot_rank_left(pmix_status_t rc)
{
    return rc == PMIX_ERR_PARTIAL_SUCCESS
#ifdef PMIX_ERR_PROC_ABORTED
           || rc == PMIX_ERR_PROC_ABORTED
#endif
#ifdef PMIX_ERR_PROC_TERM_WO_SYNC
           || rc == PMIX_ERR_PROC_TERM_WO_SYNC
#endif
        ;
}

/* A fence that collects the data every rank put, bounded by EMA_BOOT_TIMEOUT. */
static ema_status_t boot_fence(ema__boot_t *boot)
{
    pmix_info_t info[2];
    int timeout = (int)(boot->cfg.timeout + 0.999);
    pmix_status_t rc;
    size_t ninfo = 1;
    bool yes = true;

    PMIX_INFO_CONSTRUCT(&info[0]);
    PMIX_INFO_CONSTRUCT(&info[1]);
    PMIX_INFO_LOAD(&info[0], PMIX_COLLECT_DATA, &yes, PMIX_BOOL);
    if (timeout > 0) {
        PMIX_INFO_LOAD(&info[ninfo], PMIX_TIMEOUT, &timeout, PMIX_INT);
        ninfo++;
    }
    rc = PMIx_Fence(NULL, 0, info, ninfo);
    PMIX_INFO_DESTRUCT(&info[0]);
    PMIX_INFO_DESTRUCT(&info[1]);
    if (rc == PMIX_ERR_TIMEOUT) {
        ema_error("PMIx_Fence failed: %s (a peer did not join within EMA_BOOT_TIMEOUT)",
                  PMIx_Error_string(rc));
        return EMA_ERR_TIMEOUT;
    }
    if (boot_rank_left(rc)) {
        /* Open MPI's server ends the fence so once a participant has
         * disconnected: a rank whose ema_init failed before the exchange
         * and which then exited (or one that died) */
        ema_error("PMIx_Fence failed: %s: a rank left the job before the address exchange "
                  "(its ema_init failed and it exited, or it died)", PMIx_Error_string(rc));
        return EMA_ERR_PEER_LOST;
    }
    if (rc != PMIX_SUCCESS) {
        ema_error("PMIx_Fence failed: %s", PMIx_Error_string(rc));
        return EMA_ERR_BOOTSTRAP;
    }
    return EMA_SUCCESS;
}

/* Our entry in the exchange: [int32 status][blob], status 0 unless our
 * ema_init failed (ema__boot_abandon). */
static ema_status_t boot_put(int32_t status, const void *blob, size_t len)
{
    pmix_value_t value;
    pmix_status_t rc;
    char *buf = malloc(sizeof(status) + len);

    if (buf == NULL) {
        return EMA_ERR_NO_MEMORY;
    }
    memcpy(buf, &status, sizeof(status));
    if (len > 0) {
        memcpy(buf + sizeof(status), blob, len);
    }
    PMIX_VALUE_CONSTRUCT(&value);
    value.type          = PMIX_BYTE_OBJECT;
    value.data.bo.bytes = buf;
    value.data.bo.size  = sizeof(status) + len;
    rc = PMIx_Put(PMIX_LOCAL, EMA_BOOT_KEY, &value); /* copies it */
    free(buf);
    if (rc != PMIX_SUCCESS) {
        ema_error("PMIx_Put(%s) failed: %s", EMA_BOOT_KEY, PMIx_Error_string(rc));
        return EMA_ERR_BOOTSTRAP;
    }
    rc = PMIx_Commit();
    if (rc != PMIX_SUCCESS) {
        ema_error("PMIx_Commit failed: %s", PMIx_Error_string(rc));
        return EMA_ERR_BOOTSTRAP;
    }
    return EMA_SUCCESS;
}

void ema__boot_abandon(ema__boot_t *boot, ema_status_t status)
{
    if (!boot->singleton && ema_boot_pmix_up && !boot->exchanged) {
        /* ema_init is collective: the other ranks are in, or on their way
         * to, the exchange.  Leaving them there cost them EMA_BOOT_TIMEOUT
         * where this rank then stayed in the job, or exited before they
         * entered the fence (Open MPI 4.1's server ends a fence early only
         * for a participant that leaves while it runs): test_regress
         * init_one_fails failed so in CI.  Taking part with our status
         * fails them at once, whatever the timing; we wait for them as a
         * successful ema_init would (at most EMA_BOOT_TIMEOUT). */
        boot->exchanged = 1;
        ema_debug("telling the other ranks that ema_init failed here (%s)",
                  ema_strerror(status));
        (void)boot_put((int32_t)status, NULL, 0);
        (void)boot_fence(boot); /* even without our entry: the others' PMIx_Get fails */
    }
    /* PMIx stays up for the next ema_init (see ema_boot_pmix_up) */
    ema_boot_idle   = ema_boot_pmix_up;
    boot->singleton = 1;
}

ema_status_t ema__boot_exchange(ema__boot_t *boot, const void *blob, size_t len,
                                void ***blobs_p, size_t **lens_p)
{
    void **blobs = calloc(boot->size, sizeof(*blobs));
    size_t *lens = calloc(boot->size, sizeof(*lens));
    ema_status_t status;
    pmix_value_t *val;
    pmix_status_t rc;
    pmix_proc_t peer;

    if (blobs == NULL || lens == NULL) {
        status = EMA_ERR_NO_MEMORY;
        goto err_free;
    }

    if (boot->singleton) {
        blobs[0] = malloc(len ? len : 1);
        if (blobs[0] == NULL) {
            status = EMA_ERR_NO_MEMORY;
            goto err_free;
        }
        memcpy(blobs[0], blob, len);
        lens[0] = len;
        goto out;
    }

    boot->exchanged = 1;
    status = boot_put(0, blob, len);
    if (status != EMA_SUCCESS) {
        (void)boot_fence(boot); /* the others fail their PMIx_Get, not a timeout */
        goto err_free;
    }
    status = boot_fence(boot);
    if (status != EMA_SUCCESS) {
        goto err_free;
    }

    int nfailed = 0, failed = -1; /* ranks whose ema_init failed; the first */
    int32_t failed_status = 0;
    for (int r = 0; r < boot->size; r++) {
        int32_t rs;
        PMIX_LOAD_PROCID(&peer, ema_boot_proc.nspace, (pmix_rank_t)r);
        val = NULL;
        rc  = PMIx_Get(&peer, EMA_BOOT_KEY, NULL, 0, &val);
        if (rc != PMIX_SUCCESS || val == NULL || val->type != PMIX_BYTE_OBJECT ||
            val->data.bo.size < sizeof(rs)) {
            ema_error("PMIx_Get(%s) from rank %d failed: %s", EMA_BOOT_KEY, r,
                      (rc == PMIX_SUCCESS) ? "malformed entry" : PMIx_Error_string(rc));
            if (val) {
                PMIX_VALUE_RELEASE(val);
            }
            status = EMA_ERR_BOOTSTRAP;
            goto err_free;
        }
        memcpy(&rs, val->data.bo.bytes, sizeof(rs));
        if (rs != 0) {
            if (nfailed++ == 0) {
                failed        = r;
                failed_status = rs;
            }
            PMIX_VALUE_RELEASE(val);
            continue;
        }
        size_t n = val->data.bo.size - sizeof(rs);
        blobs[r] = malloc(n ? n : 1);
        if (blobs[r] == NULL) {
            PMIX_VALUE_RELEASE(val);
            status = EMA_ERR_NO_MEMORY;
            goto err_free;
        }
        memcpy(blobs[r], val->data.bo.bytes + sizeof(rs), n);
        lens[r] = n;
        PMIX_VALUE_RELEASE(val);
    }
    if (nfailed > 0) {
        ema_error("the ema_init of rank %d failed (%s)%s: every rank's ema_init fails, as it "
                  "is collective", failed, ema_strerror((ema_status_t)failed_status),
                  (nfailed > 1) ? ", and other ranks' too" : "");
        status = EMA_ERR_PEER_LOST;
        goto err_free;
    }
out:
    *blobs_p = blobs;
    *lens_p  = lens;
    return EMA_SUCCESS;

err_free:
    ema__boot_free_blobs(boot, blobs, lens);
    return status;
}

void ema__boot_free_blobs(ema__boot_t *boot, void **blobs, size_t *lens)
{
    if (blobs != NULL) {
        for (int r = 0; r < boot->size; r++) {
            free(blobs[r]);
        }
    }
    free(blobs);
    free(lens);
}
