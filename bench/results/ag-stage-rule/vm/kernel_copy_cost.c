#define _GNU_SOURCE
#include <sys/uio.h>
#include <sys/mman.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(int argc,char**argv){
  int huge=argc>1; size_t B=8<<20;
  char*src=mmap(0,B+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  char*dst=mmap(0,B+(2<<20),PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  src=(char*)(((size_t)src+(2<<20)-1)&~((size_t)(2<<20)-1)); dst=(char*)(((size_t)dst+(2<<20)-1)&~((size_t)(2<<20)-1));
  if(huge){madvise(src,B,MADV_HUGEPAGE);madvise(dst,B,MADV_HUGEPAGE);}
  memset(src,1,B);memset(dst,2,B);
  size_t sizes[]={16384,65536,262144,1<<20,4<<20};
  for(int k=0;k<5;k++){size_t n=sizes[k];int it=n<65536?20000:1000;
    struct iovec l={dst,n},r={src,n};
    double t0=now();for(int i=0;i<it;i++) if(process_vm_readv(getpid(),&l,1,&r,1,0)!=(ssize_t)n){perror("pvr");return 1;}
    double t1=now();for(int i=0;i<it;i++) {memcpy(dst,src,n); __asm__ volatile(""::"r"(dst):"memory");}
    double t2=now(); printf("%s %7zu B: process_vm_readv %.2f us, memcpy %.2f us\n",huge?"huge":"4k  ",n,(t1-t0)/it,(t2-t1)/it);}
  char buf[256]; sprintf(buf,"grep AnonHugePages /proc/%d/smaps_rollup",getpid()); system(buf);
}
