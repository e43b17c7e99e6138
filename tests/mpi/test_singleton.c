/*
 * A program started with no launcher is a world of one: rank 0, size 1,
 * ema_init returns in under a second, and put/get to itself work, across
 * segment boundaries too.  Started directly by singleton.sh, never by mpirun.
 */
#include "common.h"

#define SEG  ((size_t)64 * 1024)
#define PART (3 * SEG + 1000)

int main(void)
{
    int rank = -1, size = -1;
    ema_t_catch_crashes();
    double t0 = t_now();
    ema_status_t s = ema_init(NULL);
    double dt = t_now() - t0;
    ema_t_rank = 0;
    ema_t_current = "test_singleton_world_of_one_starts_fast";
    T_OK(s);
    /* Host memory: well under a second (0.04 s measured).  A GPU adds the
     * driver's own start (cuInit, the primary context, UCX's CUDA
     * transports): ema_init took 1.11 s on the H200, outside EMA's
     * control. */
    double limit = test_kind_is_cuda() ? 5.0 : 1.0;
    T_EXPECT(dt < limit, "ema_init took %.3f s without a launcher (limit %.0f s)", dt, limit);
    T_STATUS(ema_world_rank(&rank), EMA_SUCCESS);
    T_STATUS(ema_world_size(&size), EMA_SUCCESS);
    T_EXPECT(rank == 0, "rank %d", rank);
    T_EXPECT(size == 1, "size %d", size);
    ema_t_size = size;

    char info[4096] = "";
    FILE *f = fmemopen(info, sizeof(info) - 1, "w");
    T_STATUS(ema_info_print(f, EMA_INFO_WORLD), EMA_SUCCESS);
    fclose(f);
    T_EXPECT(strstr(info, "singleton") != NULL, "ema_info_print does not say singleton: %s",
             info);

    ema_t_current = "test_singleton_put_get_to_itself";
    void *b;
    ema_win_h win;
    T_OK(ema_win_allocate(PART, NULL, &b, &win));
    uint8_t *base = b, *buf = t_malloc(PART), *rb = t_malloc(PART);
    own_memset(win, base, 0, 0, PART);
    static const size_t offs[] = {0, SEG - 3, 2 * SEG - 1, PART - 1};
    static const size_t lens[] = {PART, 6, SEG + 2, 1};
    for (int i = 0; i < 4; i++) {
        t_fill(buf, lens[i], i, 0, offs[i]);
        T_STATUS(ema_put(win, 0, offs[i], buf, lens[i]), EMA_SUCCESS);
        T_STATUS(ema_win_flush(win, 0), EMA_SUCCESS);
        size_t bad = t_check(own_view(win, base, offs[i], lens[i]), lens[i], i, 0, offs[i]);
        T_EXPECT(bad == lens[i], "put %d not in own part at +%zu (%s)", i, bad, own_how());
        memset(rb, 0, lens[i]);
        T_STATUS(ema_get(win, 0, offs[i], rb, lens[i]), EMA_SUCCESS);
        T_EXPECT(memcmp(rb, buf, lens[i]) == 0, "get %d differs", i);
    }
    ema_request_h req;
    t_fill(buf, PART, 9, 0, 0);
    T_OK(ema_put_nb(win, 0, 0, buf, PART, &req));
    T_STATUS(ema_wait(req), EMA_SUCCESS);
    T_OK(ema_get_nb(win, 0, 0, rb, PART, &req));
    while ((s = ema_test(req)) == EMA_INPROGRESS) {
    }
    T_STATUS(s, EMA_SUCCESS);
    T_EXPECT(memcmp(rb, buf, PART) == 0, "non-blocking round trip differs");
    uint64_t old = 1;
    own_memset(win, base, SEG, 0, 8);
    T_STATUS(ema_fetch_add(win, 0, SEG, 5, &old), EMA_SUCCESS);
    T_EXPECT(old == 0, "fetch_add old %" PRIu64, old);
    T_STATUS(ema_barrier(), EMA_SUCCESS);
    T_OK(ema_win_free(win));
    free(buf);
    free(rb);
    return ema_test_finish("test_singleton");
}
