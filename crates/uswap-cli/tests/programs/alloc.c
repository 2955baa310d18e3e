// The malloc family as glibc's behaves, under uswap's allocator:
//   alloc
// posix_memalign, aligned_alloc and memalign at every power of two from 16
// bytes to 64 MiB (past mimalloc's arena slice, 64 KiB, it asked the OS,
// which uswap run forbids: NULL); malloc_usable_size and realloc of such
// blocks; ENOMEM in errno when an allocation fails; realloc(p, 0) frees
// and returns NULL; memalign and aligned_alloc at alignments that are no
// power of two (glibc rounds them up: memalign(24, n) was NULL), and
// EINVAL past the largest power of two.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <errno.h>
#include <malloc.h>
#include <string.h>
int main(void) {
  int bad = 0;
  // Through a volatile: the compiler warns of sizes it can see.
  volatile size_t huge_v = SIZE_MAX - 100;
  size_t huge = huge_v;
  for (size_t a = 16; a <= (64u<<20); a <<= 1) {
    void *p=0; int r=posix_memalign(&p, a, 1000);
    void *q=aligned_alloc(a, a*2);
    void *m=memalign(a, 3000);
    if (r||!p||!q||!m||((uintptr_t)p%a)||((uintptr_t)q%a)||((uintptr_t)m%a)) { printf("align %zu: r=%d p=%p q=%p m=%p\n", a, r, p, q, m); bad++; continue; }
    memset(p, 1, 1000); memset(q, 2, a*2); memset(m, 3, 3000);
    if (malloc_usable_size(p) < 1000 || malloc_usable_size(q) < a*2) { printf("usable %zu\n", a); bad++; }
    p = realloc(p, 5000); if (!p || ((char*)p)[999] != 1) { printf("realloc %zu\n", a); bad++; }
    free(p); free(q); free(m);
  }
  size_t odd[] = {1, 8, 24, 48, 100, 3u<<16};
  for (unsigned i = 0; i < sizeof odd / sizeof *odd; i++) {
    size_t want = 16; while (want < odd[i]) want <<= 1;
    void *m = memalign(odd[i], 1000), *q = aligned_alloc(odd[i], 1000);
    if (!m || !q || (uintptr_t)m % want || (uintptr_t)q % want) { printf("odd align %zu: %p %p\n", odd[i], m, q); bad++; }
    free(m); free(q);
  }
  errno=0; void *o=memalign(SIZE_MAX / 2 + 2, 10); if (o || errno != EINVAL) { printf("memalign past 2^63: %p errno %d\n", o, errno); bad++; }
  errno=0; void *z=malloc(huge); if (z || errno!=ENOMEM) { printf("huge malloc: %p errno %d\n", z, errno); bad++; }
  errno=0; z=calloc(huge / 2, 4); if (z || errno!=ENOMEM) { printf("huge calloc: %p errno %d\n", z, errno); bad++; }
  void *r0 = malloc(10); errno=0; void *r1 = realloc(r0, huge); if (r1 || errno!=ENOMEM) { printf("huge realloc errno %d\n", errno); bad++; } free(r0);
  r0 = malloc(10); r1 = realloc(r0, 0); if (r1 != 0) { printf("realloc(p, 0) gave %p\n", r1); free(r1); bad++; }
  puts(bad?"bad":"ok"); return bad;
}
