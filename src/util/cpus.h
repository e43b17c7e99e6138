/* The CPUs this process may run on (util/cpus.c). */
#ifndef EMA_UTIL_CPUS_H_
#define EMA_UTIL_CPUS_H_

/* The CPUs a CFS quota grants (a container's --cpus), rounded up; 0 when
 * there is none or it cannot be read (cgroup v2 cpu.max, else v1). */
long ema__cpus_quota(void);
/* The CPUs of the affinity mask, fewer if a quota grants fewer; 0 unknown. */
long ema__cpus_usable(void);

#endif
