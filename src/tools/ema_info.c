/* ema_info: what EMA sees on this machine.  See ema_info(1). */
#include <ema.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f, "usage: ema_info [-c] [-v] [-t] [-h]\n"
               "  (none)          version, topology, world and UCX transports\n"
               "  -c, --config    every EMA_* variable with its value, default and help\n"
               "  -v, --version   versions only\n"
               "  -t, --topology  topology only (no world is started)\n"
               "  -h, --help      this help\n");
}

/* @rc, or 1 where the output could not be written (a full disk, a closed
 * pipe): ema_info(1) says "1 when ema_init or printing failed". */
static int finish(int rc)
{
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "ema_info: writing the output failed: %s\n", strerror(errno));
        return 1;
    }
    return rc;
}

int main(int argc, char **argv)
{
    int opt, config = 0, version = 0, topo = 0;

    static const struct option longopts[] = {
        {"config", no_argument, NULL, 'c'},   {"version", no_argument, NULL, 'v'},
        {"topology", no_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0}};

    while ((opt = getopt_long(argc, argv, "cvth", longopts, NULL)) != -1) {
        switch (opt) {
        case 'c': config = 1; break;
        case 'v': version = 1; break;
        case 't': topo = 1; break;
        case 'h': usage(stdout); return finish(0);
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "ema_info: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if (config) {
        return finish(ema_config_print(stdout) == EMA_SUCCESS ? 0 : 1);
    }
    if (version) {
        return finish(ema_info_print(stdout, EMA_INFO_VERSION) == EMA_SUCCESS ? 0 : 1);
    }
    if (topo) {
        return finish(ema_info_print(stdout, EMA_INFO_TOPOLOGY) == EMA_SUCCESS ? 0 : 1);
    }
    ema_status_t status = ema_init(NULL);
    if (status != EMA_SUCCESS) {
        fprintf(stderr, "ema_info: ema_init failed: %s\n", ema_strerror(status));
        ema_info_print(stdout, EMA_INFO_VERSION | EMA_INFO_TOPOLOGY);
        return finish(1);
    }
    int rank = 0;
    ema_world_rank(&rank);
    if (rank == 0) {
        ema_info_print(stdout, EMA_INFO_ALL);
    }
    ema_finalize();
    return finish(0);
}
