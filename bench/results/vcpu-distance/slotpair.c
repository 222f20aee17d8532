// Two processes, each with private 256 KiB send and 512 KiB recv buffers and a shared area of
// two 256 KiB slots per rank (as ferroccl's node area): per call, copy own send into own slot
// (parity of the call), mark, wait for the peer's mark, copy the peer's slot into recv.
// Prints us per call over blocks of calls. argv[1]: blocks; argv[2]: remap the area every block.
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <time.h>
#define B (256u<<10)
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
struct ctl { _Alignas(64) _Atomic long mark[2][8]; };
int main(int argc,char**argv){
  int blocks=argc>1?atoi(argv[1]):5, remap=argc>2?atoi(argv[2]):0, calls=2000;
  size_t area=4096+4*B+2*(8192+64);
  struct ctl*c=mmap(0,4096,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  int fd=memfd_create("area",0); ftruncate(fd,area*64);
  int rank=fork()==0;
  char*send=aligned_alloc(4096,B), *recv=aligned_alloc(4096,2*B);
  memset(send,rank+1,B); memset(recv,0,2*B);
  long seq=0;
  for(int b=0;b<blocks;b++){
    size_t fo=remap? (size_t)b*area:0;
    char*base=mmap(0,area,PROT_READ|PROT_WRITE,MAP_SHARED,fd,fo);
    char*slot[2][2]; for(int r=0;r<2;r++)for(int p=0;p<2;p++) slot[r][p]=base+4096+(r*2+p)*B+r*(getenv("SKEW")?atoi(getenv("SKEW")):8256);
    // Round trips of one cache line between the two processes: how far apart their CPUs are now.
    double p0=now();
    for(long k=0;k<4000;k++){
      if(rank==0){atomic_store_explicit(&c->mark[0][2],2*k+1,memory_order_release);while(atomic_load_explicit(&c->mark[1][2],memory_order_acquire)!=2*k+1);}
      else{while(atomic_load_explicit(&c->mark[0][2],memory_order_acquire)!=2*k+1);atomic_store_explicit(&c->mark[1][2],2*k+1,memory_order_release);}
    }
    double pp=(now()-p0)/4000*1e3;
    double t0=now();
    for(int i=0;i<calls;i++,seq++){
      int p=seq&1;
      // the slot of this parity was last read by the peer at seq-2
      while(atomic_load_explicit(&c->mark[1-rank][1],memory_order_acquire)<seq-1);
      memcpy(slot[rank][p],send,B);
      atomic_store_explicit(&c->mark[rank][0],seq+1,memory_order_release);
      while(atomic_load_explicit(&c->mark[1-rank][0],memory_order_acquire)<seq+1);
      memcpy(recv+(1-rank)*B,slot[1-rank][p],B);
      atomic_store_explicit(&c->mark[rank][1],seq+1,memory_order_release);
    }
    double us=(now()-t0)/calls;
    if(rank==0) printf("%.0fns/%.1fus ",pp,us);
    munmap(base,area);
  }
  if(rank==0){printf("\n");wait(0);}
}
