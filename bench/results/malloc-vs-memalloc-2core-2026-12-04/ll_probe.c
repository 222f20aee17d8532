/* Flag-per-line probe (record for malloc-vs-memalloc-2core-2026-12-04.md): two processes
 * exchange len bytes through shared memory as a 2-rank one-shot all-reduce does; mode 0 writes
 * the data then one flag line, mode 1 gives every 64-byte line 56 data bytes and its own flag
 * (as NCCL's LL protocols do). gcc -O2 ll_probe.c -o ll_probe && ./ll_probe 512 1 2000000
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stdint.h>
#include <stdatomic.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
// Symmetric exchange like a 2-rank one-shot all-reduce: each side writes `len` bytes into its
// slot and signals; then waits for the other's and reads (sums) them. Mode 0: data then a flag
// line; mode 1: every 64-byte line carries 56 bytes and its own flag word.
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define DEPTH 64
int main(int argc,char**argv){
  size_t len=atol(argv[1]); int mode=atoi(argv[2]); long iters=atol(argv[3]);
  size_t lines = mode? (len+55)/56 : (len+63)/64;
  size_t slotb = (lines+1)*64;
  char*sh=mmap(0,2*DEPTH*slotb+8192,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  memset(sh,0,2*DEPTH*slotb+8192);
  int me = fork()==0;
  char in[8192], out[8192]; memset(in,me+1,sizeof in);
  double t0=now(); volatile long sink=0;
  for(long s=1;s<=iters;s++){
    char*mine=sh+(me*DEPTH+(s%DEPTH))*slotb, *theirs=sh+((1-me)*DEPTH+(s%DEPTH))*slotb;
    if(mode==0){
      memcpy(mine+64,in,len);
      atomic_store_explicit((_Atomic long*)mine,s,memory_order_release);
      while(atomic_load_explicit((_Atomic long*)theirs,memory_order_acquire)<s);
      memcpy(out,theirs+64,len);
    } else {
      for(size_t l=0;l<lines;l++){ size_t n=len-l*56<56?len-l*56:56; memcpy(mine+l*64,in+l*56,n); atomic_store_explicit((_Atomic long*)(mine+l*64+56),s,memory_order_release);}
      for(size_t l=0;l<lines;l++){ size_t n=len-l*56<56?len-l*56:56; while(atomic_load_explicit((_Atomic long*)(theirs+l*64+56),memory_order_acquire)<s); memcpy(out+l*56,theirs+l*64,n);}
    }
    sink+=out[0];
    // slot reuse guard omitted: DEPTH ahead is never reached since both sides wait each other
  }
  double t=(now()-t0)/iters;
  if(me) _exit(0);
  wait(0);
  printf("len %zu mode %d: %.3f us per exchange\n",len,mode,t*1e6);
}
