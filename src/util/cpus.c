/* The CPUs this process may use: its affinity mask, and a CFS quota. */
#define _GNU_SOURCE
#include "cpus.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The CPUs a CFS quota grants (a container's --cpus), rounded up; 0 when
 * there is none or it cannot be read (cgroup v2 cpu.max, else v1). */
long ema__cpus_quota(void)
{
    long long quota = -1, period = 0;
    char word[32];
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");

    if (f != NULL) {
        if (fscanf(f, "%31s %lld", word, &period) == 2 && strcmp(word, "max") != 0) {
            quota = atoll(word);
        }
        fclose(f);
    } else if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r")) != NULL) {
        if (fscanf(f, "%lld", &quota) != 1) {
            quota = -1;
        }
        fclose(f);
        if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r")) != NULL) {
            if (fscanf(f, "%lld", &period) != 1) {
                period = 0;
            }
            fclose(f);
        }
    }
    return (quota > 0 && period > 0) ? (long)((quota + period - 1) / period) : 0;
}


long ema__cpus_usable(void)
{
    cpu_set_t set;
    long cpus = 0, quota = ema__cpus_quota();

    if (sched_getaffinity(0, sizeof(set), &set) == 0) {
        cpus = CPU_COUNT(&set);
    }
    if (quota > 0 && (cpus == 0 || quota < cpus)) {
        cpus = quota;
    }
    return cpus;
}
