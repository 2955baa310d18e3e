/* UFFDIO_MOVE of a run in one call against one page at a time, with a
 * second thread busy on the other CPU (every flush a shootdown); and
 * process_madvise(MADV_DONTNEED) of scattered pages in batches of 64.
 * gcc -O2 -pthread move_run_probe.c -o probe && ./probe  (root, or
 * vm.unprivileged_userfaultfd=1).  docs/DESIGN.md, "Batched eviction". */
#define _GNU_SOURCE
#include <linux/userfaultfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#define PG 4096UL
struct uffdio_move{unsigned long long dst,src,len,mode;long long move;};
#define UFFD_FEATURE_MOVE (1<<16)
#define UFFDIO_MOVE _IOWR(0xAA,0x05,struct uffdio_move)
#define N 16384UL
static volatile int stop;
static char *busy;
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static void *spin(void*a){pin(1);while(!stop){for(int i=0;i<64;i++)busy[i*PG]++;}return 0;}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec*1e6+t.tv_nsec/1e3;}
int main(){
 pin(0);
 int u=syscall(SYS_userfaultfd,O_CLOEXEC|UFFD_USER_MODE_ONLY);
 struct uffdio_api api={.api=UFFD_API,.features=UFFD_FEATURE_SIGBUS|UFFD_FEATURE_MOVE};
 if(ioctl(u,UFFDIO_API,&api)){perror("api");return 1;}
 char*r=mmap(0,N*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 char*st=mmap(0,N*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);
 madvise(r,N*PG,MADV_NOHUGEPAGE);madvise(st,N*PG,MADV_NOHUGEPAGE);
 struct uffdio_register reg={.range={(unsigned long)r,N*PG},.mode=UFFDIO_REGISTER_MODE_MISSING};
 struct uffdio_register reg2={.range={(unsigned long)st,N*PG},.mode=UFFDIO_REGISTER_MODE_MISSING};
 ioctl(u,UFFDIO_REGISTER,&reg2);
 busy=mmap(0,64*PG,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS|MAP_POPULATE,-1,0);
 pthread_t th;pthread_create(&th,0,spin,0);usleep(10000);
 int runs[]={1,16,64,512};
 for(int k=0;k<4;k++){int R=runs[k];
  for(int mode=0;mode<2;mode++){
   memset(r,1,N*PG); if(ioctl(u,UFFDIO_REGISTER,&reg)){perror("reg");return 1;}
   double t0=now();
   for(unsigned long p=0;p+R<=N;p+=R){
    if(mode==0){ for(int i=0;i<R;i++){struct uffdio_move m={.dst=(unsigned long)st+(p+i)*PG,.src=(unsigned long)r+(p+i)*PG,.len=PG};if(ioctl(u,UFFDIO_MOVE,&m)){perror("mv");return 1;}}}
    else {struct uffdio_move m={.dst=(unsigned long)st+p*PG,.src=(unsigned long)r+p*PG,.len=R*PG};if(ioctl(u,UFFDIO_MOVE,&m)){perror("mvr");return 1;}}
   }
   double t=now()-t0;
   printf("run %3d %s: %.2f us/page\n",R,mode?"one call":"per page",t/N);
   madvise(st,N*PG,MADV_DONTNEED); struct uffdio_range rg={(unsigned long)r,N*PG}; ioctl(u,UFFDIO_UNREGISTER,&rg);
  }
 }
 // scattered: process_madvise dontneed of every 4th page in batches of 64
 memset(r,1,N*PG);
 struct iovec iov[64];double t0=now();int n=0;unsigned long cnt=0;
 for(unsigned long p=0;p<N;p+=4){iov[n].iov_base=r+p*PG;iov[n].iov_len=PG;n++;cnt++;
  if(n==64){int pf=syscall(SYS_pidfd_open,getpid(),0);static int pfd=-1;if(pfd<0)pfd=pf;else close(pf);
   if(syscall(SYS_process_madvise,pfd,iov,n,MADV_DONTNEED,0)<0){perror("pm");return 1;}n=0;}}
 printf("scattered process_madvise 64: %.2f us/page (incl pidfd_open)\n",(now()-t0)/cnt);
 stop=1;pthread_join(th,0);return 0;}
