// Cache-line round trip between a thread on CPU 0 and one on CPU 1, reported every 100 ms:
// how far apart the two vCPUs are on the host, over time.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static _Alignas(64) _Atomic long ball;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void*other(void*a){pin(1);for(;;){long v=atomic_load_explicit(&ball,memory_order_acquire);if(v<0)return 0;if(v&1)atomic_store_explicit(&ball,v+1,memory_order_release);}}
int main(int argc,char**argv){
  double secs=argc>1?atof(argv[1]):10;
  pthread_t t;pthread_create(&t,0,other,0);pin(0);
  double t0=now(),t1=t0;long n=0;
  while(now()-t0<secs){
    long v=atomic_load_explicit(&ball,memory_order_relaxed);
    atomic_store_explicit(&ball,v+1,memory_order_release);
    while(atomic_load_explicit(&ball,memory_order_acquire)==v+1);
    n++;
    if(n%4096==0){double x=now();if(x-t1>=0.1){printf("%.1f %.0f ns\n",x-t0,(x-t1)/n*1e9);fflush(stdout);t1=x;n=0;}}
  }
  atomic_store(&ball,-1);pthread_join(t,0);
}
