/* ema_strerror: every status code has its own name, and anything else is
 * "unknown status".  Safe without ema_init. */
#include <ema.h>

#include "check_main.h"

#include <check.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const ema_status_t all_codes[] = {
    EMA_SUCCESS,         EMA_INPROGRESS,         EMA_ERR_INVALID_PARAM, EMA_ERR_INVALID_HANDLE,
    EMA_ERR_INVALID_RANK, EMA_ERR_RANGE,         EMA_ERR_ALIGNMENT,     EMA_ERR_STATE,
    EMA_ERR_NO_MEMORY,   EMA_ERR_NO_RESOURCE,    EMA_ERR_UNSUPPORTED,   EMA_ERR_BOOTSTRAP,
    EMA_ERR_TRANSPORT,   EMA_ERR_PEER_LOST,      EMA_ERR_TIMEOUT,       EMA_ERR_IO,
    EMA_ERR_DEVICE};
#define NCODES (sizeof(all_codes) / sizeof(all_codes[0]))

EMA_TEST("strerror", test_every_status_code_has_a_distinct_known_string)
{
    for (size_t i = 0; i < NCODES; i++) {
        const char *s = ema_strerror(all_codes[i]);
        ck_assert_ptr_nonnull(s);
        ck_assert_msg(s[0] != '\0', "empty string for %d", all_codes[i]);
        ck_assert_msg(strstr(s, "unknown") == NULL, "code %d is '%s'", all_codes[i], s);
        for (size_t j = 0; j < i; j++) {
            ck_assert_msg(strcmp(s, ema_strerror(all_codes[j])) != 0,
                          "codes %d and %d share '%s'", all_codes[i], all_codes[j], s);
        }
    }
}
END_TEST

EMA_TEST("strerror", test_status_values_are_never_renumbered)
{
    ck_assert_int_eq(EMA_SUCCESS, 0);
    ck_assert_int_eq(EMA_INPROGRESS, 1);
    ck_assert_int_eq(EMA_ERR_INVALID_PARAM, -1);
    ck_assert_int_eq(EMA_ERR_STATE, -6);
    ck_assert_int_eq(EMA_ERR_NO_MEMORY, -10);
    ck_assert_int_eq(EMA_ERR_UNSUPPORTED, -12);
    ck_assert_int_eq(EMA_ERR_BOOTSTRAP, -20);
    ck_assert_int_eq(EMA_ERR_DEVICE, -25);
    for (size_t i = 0; i < NCODES; i++) { /* errors are negative */
        ck_assert(all_codes[i] <= 1);
    }
}
END_TEST

EMA_TEST("strerror", test_unknown_values_give_unknown_status)
{
    static const int unknown[] = {2, 3, 100, -7, -9, -13, -19, -26, -100, INT_MAX, INT_MIN};
    for (size_t i = 0; i < sizeof(unknown) / sizeof(unknown[0]); i++) {
        const char *s = ema_strerror((ema_status_t)unknown[i]);
        ck_assert_ptr_nonnull(s);
        ck_assert_msg(strcmp(s, "unknown status") == 0, "value %d gives '%s'", unknown[i], s);
    }
}
END_TEST

int main(void)
{
    return ema_check_main("status", CK_ENV);
}
