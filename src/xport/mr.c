/* Memory registration with UCX: each tier of every rank, and the peers' keys. */
#include "xport.h"

#include <stdlib.h>
#include <string.h>

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

