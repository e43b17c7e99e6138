/* Every rank puts its rank number into every other rank's part, then reads
 * its own part and checks what arrived.  Run: mpirun -n 4 ./examples/hello
 * The own part is read with ema_get, not through the base pointer: on the
 * cuda memory kind the base pointer is device memory (see cuda_window.cu). */
#include <ema.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call) do { ema_status_t s_ = (call); if (s_ != EMA_SUCCESS) { \
    fprintf(stderr, "%s failed: %s\n", #call, ema_strerror(s_)); exit(1); } } while (0)

int main(void)
{
    int rank, size;
    void *base;
    ema_win_h win;

    CHECK(ema_init(NULL));
    CHECK(ema_world_rank(&rank));
    CHECK(ema_world_size(&size));
    CHECK(ema_win_allocate(size * sizeof(uint64_t), NULL, &base, &win));
    for (int peer = 0; peer < size; peer++) {
        uint64_t v = 1000 + rank;
        CHECK(ema_put(win, peer, rank * sizeof(uint64_t), &v, sizeof(v)));
    }
    CHECK(ema_win_flush_all(win));
    CHECK(ema_barrier());
    int ok = 1;
    for (int r = 0; r < size; r++) {
        uint64_t v = 0;
        CHECK(ema_get(win, rank, r * sizeof(uint64_t), &v, sizeof(v)));
        ok &= (v == (uint64_t)(1000 + r));
    }
    printf("rank %d of %d: %s\n", rank, size, ok ? "ok" : "WRONG");
    CHECK(ema_win_free(win));
    CHECK(ema_finalize());
    return ok ? 0 : 1;
}
