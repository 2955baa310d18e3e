#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/syscall.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
int main(int c,char**v){
  int n=atoi(v[1]); int fd=open("/dev/zero",O_RDONLY); char buf[64]; char *hb=malloc(64);
  double t=now(); for(int i=0;i<n;i++) syscall(SYS_getppid); double a=now()-t;
  t=now(); for(int i=0;i<n;i++) syscall(SYS_read,fd,buf,64); double b=now()-t;
  t=now(); for(int i=0;i<n;i++) syscall(SYS_read,fd,hb,64); double d=now()-t;
  printf("getppid %.0f ns  read(stack) %.0f ns  read(heap, raw) %.0f ns\n",a/n*1e9,b/n*1e9,d/n*1e9);
}
