/* uswap: a swap subsystem in user space. C ABI; link with -luswap_c (pkg-config: uswap). */

#ifndef USWAP_H
#define USWAP_H

/* Generated from crates/uswap-c/src/lib.rs by cbindgen; `cargo test -p uswap-c` checks it is in sync (USWAP_WRITE_HEADER=1 rewrites it). */

#include <stddef.h>
#include <stdint.h>

// What a call returned: `USWAP_OK`, or why it failed (the message is in
// `uswap_last_error()`).
typedef enum uswap_status {
  // Done.
  USWAP_OK = 0,
  // A pointer argument was NULL.
  USWAP_ERR_NULL = 1,
  // A value out of range (a budget under a page, a length of zero, a
  // range past a region's end) or a string that is not UTF-8.
  USWAP_ERR_INVALID = 2,
  // A swap spec that does not parse (`zram:SIZE`, `file:PATH:SIZE`,
  // `nbd://HOST/EXPORT`, ...).
  USWAP_ERR_SPEC = 3,
  // A swap device could not be set up (a file, a server).
  USWAP_ERR_DEVICE = 4,
  // The kernel lacks what uswap needs, or refused it (userfaultfd,
  // `UFFDIO_MOVE`: Linux 6.8 or newer).
  USWAP_ERR_KERNEL = 5,
  // Memory for the region or uswap's tables could not be mapped.
  USWAP_ERR_NOMEM = 6,
  // Too many regions, or pages, for this instance.
  USWAP_ERR_LIMIT = 7,
  // Called in a child of the process that opened the instance that did
  // not adopt it (made by a raw `clone`, not `fork`).
  USWAP_ERR_FORKED = 8,
  // uswap failed inside (a bug, please report it with the message).
  USWAP_ERR_PANIC = 9,
} uswap_status;

// Who serves faults (see the README: SIGBUS mode is any user's and the
// faster; handler-thread mode also serves the kernel's own accesses to
// a region, such as `read(2)` into it, and needs root or
// `vm.unprivileged_userfaultfd=1`).
typedef enum uswap_fault_mode {
  // The faulting thread, in a SIGBUS handler (the default).
  USWAP_MODE_SIGBUS = 0,
  // uswap's handler threads.
  USWAP_MODE_HANDLER = 1,
} uswap_fault_mode;

// Settings for `uswap_open`.
typedef struct uswap_config uswap_config;

// A mapped region.
typedef struct uswap_region uswap_region;

// An open instance.
typedef struct uswap_swap uswap_swap;

// An instance's statistics (`uswap_stats`): bytes and counts.
typedef struct uswap_stats {
  // The budget.
  uint64_t budget_bytes;
  // Memory of the regions resident now.
  uint64_t resident_bytes;
  // The most ever resident.
  uint64_t peak_resident_bytes;
  // Swap space in all.
  uint64_t swap_total_bytes;
  // Swap space holding pages.
  uint64_t swap_used_bytes;
  // Faults served.
  uint64_t faults;
  // Pages read back from swap by faults.
  uint64_t swapins;
  // Pages read ahead of faults.
  uint64_t readahead;
  // Pages evicted.
  uint64_t evictions;
  // Bytes written to the swap devices.
  uint64_t io_write_bytes;
  // Bytes read from the swap devices.
  uint64_t io_read_bytes;
} uswap_stats;

#ifdef __cplusplus
extern "C" {
#endif // __cplusplus

// The message of the last call on this thread that failed ("" after
// one that worked): one line, naming the cause and what to do.  Valid
// until the next uswap call on this thread.
const char *uswap_last_error(void);

// New settings: a 64 MiB budget, no device yet, SIGBUS mode.
struct uswap_config *uswap_config_new(void);

// Free settings from `uswap_config_new` (NULL is ignored).
//
// # Safety
// `config` is NULL or from `uswap_config_new`, not freed before.
void uswap_config_free(struct uswap_config *config);

// Set the memory budget: at most this many bytes of the regions are
// resident (at least a page).
//
// # Safety
// `config` is NULL or a live config.
enum uswap_status uswap_config_budget(struct uswap_config *config, uint64_t bytes);

// Add a swap device, written as a swap spec: `zram:1G`, `ram:512M`,
// `file:/var/tmp/x.swap:8G`, `zram:1G,file:/var/tmp/x.swap:8G`,
// `nbd://HOST/EXPORT`...  Devices are used in the order given.
//
// # Safety
// `config` is NULL or a live config; `spec` is NULL or a NUL-terminated
// string.
enum uswap_status uswap_config_device(struct uswap_config *config, const char *spec);

// Who serves faults (default `USWAP_MODE_SIGBUS`).
//
// # Safety
// `config` is NULL or a live config.
enum uswap_status uswap_config_fault_mode(struct uswap_config *config, enum uswap_fault_mode mode);

// Open an instance with `config` (which the caller still owns): its
// devices made, its threads started.  Without a device, a compressed
// store of four times the budget.
//
// # Safety
// `config` is NULL or a live config; `out` is NULL or writable.
enum uswap_status uswap_open(const struct uswap_config *config, struct uswap_swap **out);

// Let the handle go (NULL is ignored).  Regions still mapped stay
// usable; the instance ends with the last of them.
//
// # Safety
// `swap` is NULL or from `uswap_open`, not closed before.
void uswap_close(struct uswap_swap *swap);

// Map a region of `len` bytes (rounded up to pages), zero filled, paged
// under the instance's budget.
//
// # Safety
// `swap` is NULL or a live instance; `out` is NULL or writable.
enum uswap_status uswap_map(const struct uswap_swap *swap,
                            uintptr_t len,
                            struct uswap_region **out);

// The region's first byte (page aligned).
//
// # Safety
// `region` is NULL (then NULL is returned) or a live region.
void *uswap_region_addr(const struct uswap_region *region);

// The region's length in bytes (whole pages).
//
// # Safety
// `region` is NULL (then 0) or a live region.
uintptr_t uswap_region_len(const struct uswap_region *region);

// Unmap a region: its memory and swap are given back, its address is
// no longer the caller's.  NULL is `USWAP_ERR_NULL`.
//
// # Safety
// `region` is NULL or from `uswap_map`, not unmapped before; nothing
// touches its memory afterwards.
enum uswap_status uswap_unmap(struct uswap_region *region);

// Discard `len` bytes at `offset` of a region (whole pages): they read
// as zeros again and their memory and swap are given back, as
// `MADV_DONTNEED` does for anonymous memory.
//
// # Safety
// `region` is NULL or a live region.
enum uswap_status uswap_discard(const struct uswap_region *region, uintptr_t offset, uintptr_t len);

// Change the budget at run time (pages over it are evicted).
//
// # Safety
// `swap` is NULL or a live instance.
enum uswap_status uswap_set_budget(const struct uswap_swap *swap, uint64_t bytes);

// The instance's statistics now, into `out`.
//
// # Safety
// `swap` is NULL or a live instance; `out` is NULL or writable.
enum uswap_status uswap_stats_get(const struct uswap_swap *swap, struct uswap_stats *out);

#ifdef __cplusplus
}  // extern "C"
#endif  // __cplusplus

#endif  /* USWAP_H */
