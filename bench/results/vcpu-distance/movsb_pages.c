// memcpy(dst, src, 256 KiB): every page distance 0-16 MiB, dst page offset 0 or 64.
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(void){
  size_t len=256<<10, span=40<<20;
  char*base=mmap(0,span,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(base,span,MADV_NOHUGEPAGE); memset(base,1,span);
  int offs[]={0,64,128};
  for(int oi=0;oi<3;oi++){ int slow=0,n=0;
   for(size_t d=len+4096; d<=(16u<<20); d+=4096){
    char*src=base+(17u<<20); char*dst=src+d+offs[oi]; char*dst2=src-d+offs[oi];
    for(int w=0;w<2;w++){ char*D=w?dst2:dst;
     double best=1e9;
     for(int r=0;r<5;r++){double t=now();memcpy(D,src,len);double e=now()-t;if(e<best)best=e;}
     n++; if(best>20){slow++; if(slow<10) printf("off %d delta %s%zu KiB: %.1f us\n",offs[oi],w?"-":"+",d>>10,best);}
    }
   }
   printf("off %d: %d slow of %d\n",offs[oi],slow,n);
  }
}
