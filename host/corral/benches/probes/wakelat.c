// How late a nice-0 thread wakes beside two nice-10 threads spinning on
// both cores, with the spinners' EEVDF slice at the default (0) or at
// the given ns (sched_setattr's sched_runtime). Not built by cargo:
// gcc -O2 -pthread -o wakelat wakelat.c && ./wakelat 0 && ./wakelat 100000
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/syscall.h>
struct sched_attr { uint32_t size, sched_policy; uint64_t sched_flags; int32_t sched_nice; uint32_t sched_priority; uint64_t sched_runtime, sched_deadline, sched_period; uint32_t util_min, util_max; };
static uint64_t slice;
static volatile int stop;
static void *spin(void *x) {
  setpriority(PRIO_PROCESS, 0, 10);
  if (slice) { struct sched_attr a; memset(&a,0,sizeof a); a.size=sizeof a; syscall(SYS_sched_getattr,0,&a,sizeof a,0); a.sched_runtime=slice; a.sched_flags=0; if (syscall(SYS_sched_setattr,0,&a,0)) perror("setattr"); }
  volatile uint64_t n=0; while(!stop) n++; return 0;
}
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec*1e6+t.tv_nsec/1e3;}
int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b; return x<y?-1:x>y;}
int main(int c, char**v){
  slice = strtoull(v[1],0,10);
  pthread_t t[2]; for(int i=0;i<2;i++) pthread_create(&t[i],0,spin,0);
  usleep(100000);
  int N=3000; double *lat=malloc(N*sizeof(double));
  for(int i=0;i<N;i++){ double s=now(); usleep(500); lat[i]=now()-s-500; }
  stop=1; for(int i=0;i<2;i++) pthread_join(t[i],0);
  qsort(lat,N,sizeof(double),cmp); double sum=0; for(int i=0;i<N;i++) sum+=lat[i];
  printf("slice %llu: wake overshoot avg %.0f us p50 %.0f p99 %.0f max %.0f\n",(unsigned long long)slice,sum/N,lat[N/2],lat[N*99/100],lat[N-1]);
}
