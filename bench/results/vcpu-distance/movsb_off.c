// memcpy(dst, src, 256 KiB) time against (dst - src) mod 4096, src page-aligned.
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(void){
  size_t len=256<<10, span=8<<20;
  char*base=mmap(0,span,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
  madvise(base,span,MADV_NOHUGEPAGE); memset(base,1,span);
  for(int so=0; so<4096; so+=1024) for(int off=-256; off<=4096; off+= (off<256&&off>-256)?8:64){
    char*src=base+so; char*dst=base+(1<<20)+so+off;
    double best=1e9;
    for(int r=0;r<10;r++){double t=now();memcpy(dst,src,len);double e=now()-t;if(e<best)best=e;}
    if(best>20) printf("src+%d dst-src mod 4096 = %d: %.1f us\n",so,(off%4096+4096)%4096,best);
  }
}
