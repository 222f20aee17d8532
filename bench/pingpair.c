// Cache-line round trip (ns) between a thread on CPU a and one on CPU b, over `secs`.
// Usage: pingpair a b secs
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static _Alignas(64) _Atomic long ball;
static int cpu_b;
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
static int pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);return pthread_setaffinity_np(pthread_self(),sizeof s,&s);}
static void*other(void*a){(void)a;if(pin(cpu_b)!=0){fprintf(stderr,"cannot run on CPU %d\n",cpu_b);exit(1);}for(;;){long v=atomic_load_explicit(&ball,memory_order_acquire);if(v<0)return 0;if(v&1)atomic_store_explicit(&ball,v+1,memory_order_release);}}
int main(int argc,char**argv){
  if(argc<4){fprintf(stderr,"usage: pingpair a b secs\n");return 2;}
  int a=atoi(argv[1]); cpu_b=atoi(argv[2]); double secs=atof(argv[3]);
  pthread_t t;
  if(pthread_create(&t,0,other,0)!=0){perror("pthread_create");return 1;}
  if(pin(a)!=0){fprintf(stderr,"cannot run on CPU %d\n",a);atomic_store(&ball,-1);pthread_join(t,0);return 1;}
  double t0=now();long n=0;
  while(now()-t0<secs){
    for(int k=0;k<256;k++){
      long v=atomic_load_explicit(&ball,memory_order_relaxed);
      atomic_store_explicit(&ball,v+1,memory_order_release);
      while(atomic_load_explicit(&ball,memory_order_acquire)==v+1);
    }
    n+=256;
  }
  printf("%.0f\n",(now()-t0)/n*1e9);
  atomic_store(&ball,-1);pthread_join(t,0);
}
