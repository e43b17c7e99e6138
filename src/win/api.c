/* Public window calls: argument checks, then the win layer. */
#include "win.h"

#include "util/log.h"
#include "util/state.h"

ema__win_ctx_t *ema__win_world; /* set by the runtime between init and finalize */

EMA_EXPORT ema_status_t ema_win_allocate(size_t size, const ema_win_params_t *params,
                                         void **base_p, ema_win_h *win_p)
{
    ema_status_t status = ema__check_ready();
    if (status != EMA_SUCCESS) {
        return status;
    }
    /* Argument errors are found locally, but the call is collective: a rank
     * that returned at once would leave the others waiting for it.  So the
     * rank still takes part, allocating nothing, and every rank fails with
     * EMA_ERR_INVALID_PARAM; nothing is allocated anywhere. */
    status = EMA_SUCCESS;
    if (base_p == NULL || win_p == NULL) {
        status = EMA_ERR_INVALID_PARAM;
    } else if (params != NULL &&
               ((params->field_mask & ~(uint64_t)EMA_WIN_PARAM_FIELD_MAX_SIZE) ||
                ((params->field_mask & EMA_WIN_PARAM_FIELD_MAX_SIZE) &&
                 (params->max_size < size || params->max_size > ((size_t)1 << 50))))) {
        status = EMA_ERR_INVALID_PARAM;
    } else if (size > ((size_t)1 << 50)) { /* beyond any machine: a negative size cast */
        status = EMA_ERR_INVALID_PARAM;
    }
    return ema__win_allocate(ema__win_world, status, size, params, base_p, win_p);
}

EMA_EXPORT ema_status_t ema_win_size(ema_win_h win, int rank, size_t *size_p)
{
    ema_status_t status = ema__win_check_live(win);
    if (status != EMA_SUCCESS) {
        return status;
    }
    if (rank < 0 || rank >= win->ctx->size) {
        return EMA_ERR_INVALID_RANK;
    }
    if (size_p == NULL) {
        return EMA_ERR_INVALID_PARAM;
    }
    *size_p = atomic_load(&win->parts[rank].size);
    return EMA_SUCCESS;
}
