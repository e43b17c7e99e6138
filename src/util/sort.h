/*
 * Comparators for qsort() on the plain types the runtime sorts.
 */
#ifndef EMA_UTIL_SORT_H
#define EMA_UTIL_SORT_H

#include <stdint.h>

/* Ascending uint32_t (segment indices). */
static inline int ema__cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

#endif
