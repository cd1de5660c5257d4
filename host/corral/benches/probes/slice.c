// Sets the EEVDF slice (sched_runtime, ns) of the given thread ids,
// keeping their policy and nice: ./slice 100000 TID... Not built by cargo.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
struct sched_attr { uint32_t size, sched_policy; uint64_t sched_flags; int32_t sched_nice; uint32_t sched_priority; uint64_t sched_runtime, sched_deadline, sched_period; uint32_t util_min, util_max; };
int main(int argc, char **argv) {
  uint64_t slice = strtoull(argv[1], 0, 10);
  for (int i = 2; i < argc; i++) {
    struct sched_attr a; memset(&a, 0, sizeof a); a.size = sizeof a;
    int tid = atoi(argv[i]);
    if (syscall(SYS_sched_getattr, tid, &a, sizeof a, 0)) { perror("getattr"); continue; }
    a.sched_runtime = slice; a.sched_flags = 0;
    if (syscall(SYS_sched_setattr, tid, &a, 0)) { perror("setattr"); continue; }
    memset(&a, 0, sizeof a);
    syscall(SYS_sched_getattr, tid, &a, sizeof a, 0);
    printf("%d nice %d runtime %llu\n", tid, a.sched_nice, (unsigned long long)a.sched_runtime);
  }
}
