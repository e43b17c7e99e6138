/*
 * Write the corpus of fuzz_corpus.c, one file per entry, into a directory
 * (tests/fuzz/corpus): `gen_corpus DIR`.  The replay test reads it back.
 */
#include "fuzz_world.h"

#include <stdio.h>
#include <stdlib.h>

static int failed;

static void write_one(const char *name, const uint8_t *data, size_t len, void *arg)
{
    char path[4096];
    snprintf(path, sizeof(path), "%s/%s", (const char *)arg, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(data, 1, len, f) != len || fclose(f) != 0) {
        perror(path);
        failed = 1;
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: %s DIR\n", argv[0]);
        return 2;
    }
    int n = ema_fuzz_corpus(write_one, argv[1]);
    printf("%d files in %s\n", n, argv[1]);
    return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
