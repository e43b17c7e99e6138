/* The library's lifecycle state, checked at the top of every public call. */
#ifndef EMA_UTIL_STATE_H_
#define EMA_UTIL_STATE_H_

#include <ema.h>
#include <stdatomic.h>

enum {
    EMA_STATE_NONE      = 0, /* ema_init not called yet */
    EMA_STATE_INITING   = 1, /* inside ema_init */
    EMA_STATE_READY     = 2,
    EMA_STATE_FINALIZED = 3
};

extern atomic_int ema__state;

static inline ema_status_t ema__check_ready(void)
{
    return (atomic_load_explicit(&ema__state, memory_order_acquire) == EMA_STATE_READY)
               ? EMA_SUCCESS
               : EMA_ERR_STATE;
}

/* ema__check_ready(), for a call that fills *@out: EMA_ERR_INVALID_PARAM
 * for a NULL @out. */
static inline ema_status_t ema__check_ready_out(const void *out)
{
    ema_status_t status = ema__check_ready();
    return (status == EMA_SUCCESS && out == NULL) ? EMA_ERR_INVALID_PARAM : status;
}

/* @st is EMA_SUCCESS or an error code ema_strerror knows (util/status.c):
 * for statuses a peer sends (an atomic's result, an allocation's verdict). */
int ema__status_known_error(int32_t st);

#endif
