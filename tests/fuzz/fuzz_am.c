/*
 * The libFuzzer target: one active message per input, through the real
 * dispatch point and handlers, in the world of fuzz_world.c (which aborts
 * where an invariant breaks).  Built with clang by contrib/fuzz.sh, or by
 * `configure CC=clang --enable-fuzz` (tests/fuzz/README).
 */
#include "fuzz_world.h"

#include "util/log.h"

#include <stdint.h>

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    ema__log_level = EMA_LOG_ERROR; /* each kind of malformed message once */
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    return ema__am_fuzz_one(data, size);
}
