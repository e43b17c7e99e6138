/*
 * Started with a launcher's environment whose PMIx server cannot be reached
 * (bootstrap_broken.sh sets PMIX_NAMESPACE=bogus PMIX_SERVER_URI4=garbage):
 * ema_init must fail with EMA_ERR_BOOTSTRAP quickly, never hang, and leave
 * the library uninitialised.  The script checks the stderr is one line.
 */
#include "common.h"

int main(void)
{
    int rank = 4242;
    ema_t_current = "test_init_with_unreachable_pmix_server_fails_fast";
    double t0 = t_now();
    ema_status_t s = ema_init(NULL);
    double dt = t_now() - t0;
    T_STATUS(s, EMA_ERR_BOOTSTRAP);
    T_EXPECT(dt < 5.0, "ema_init took %.3f s to fail", dt);
    /* nothing changed: still not initialised, and a retry fails the same way */
    T_STATUS(ema_world_rank(&rank), EMA_ERR_STATE);
    T_EXPECT(rank == 4242, "ema_world_rank wrote its output");
    T_STATUS(ema_finalize(), EMA_ERR_STATE);
    if (s == EMA_SUCCESS) {
        ema_finalize();
    }
    printf("%s test_bootstrap_broken: ema_init returned %s in %.3f s\n",
           ema_t_failures ? "FAIL" : "PASS", ema_strerror(s), dt);
    return ema_t_failures ? 1 : 0;
}
