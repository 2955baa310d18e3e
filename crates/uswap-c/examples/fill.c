/* uswap from C: a region four times its budget, every byte written and
 * verified, the statistics read, and each error code provoked.
 *
 *   cargo build --release -p uswap-c
 *   cc -O2 -Icrates/uswap-c/include crates/uswap-c/examples/fill.c \
 *      target/release/libuswap_c.a -lpthread -ldl -lm -o fill
 *   ./fill 256       # MiB of region; the budget is a quarter of it
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "uswap.h"

#define CHECK(call)                                                          \
    do {                                                                     \
        uswap_status s_ = (call);                                            \
        if (s_ != USWAP_OK) {                                                \
            fprintf(stderr, "%s: %d: %s\n", #call, (int)s_, uswap_last_error()); \
            exit(1);                                                         \
        }                                                                    \
    } while (0)

static unsigned char byte_at(size_t i) { return (unsigned char)((i * 2654435761u) >> 13); }

/* A call that must fail with `want`, and say why. */
static void expect(const char *what, uswap_status got, uswap_status want) {
    const char *msg = uswap_last_error();
    if (got != want || msg == NULL || msg[0] == '\0') {
        fprintf(stderr, "%s: got %d, wanted %d (%s)\n", what, (int)got, (int)want, msg ? msg : "no message");
        exit(2);
    }
    printf("error %d for %s: %s\n", (int)got, what, msg);
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
    uswap_fault_mode mode = argc > 2 && strcmp(argv[2], "handler") == 0 ? USWAP_MODE_HANDLER : USWAP_MODE_SIGBUS;
    size_t len = mib << 20;

    uswap_config *cfg = uswap_config_new();
    CHECK(uswap_config_budget(cfg, len / 4));
    CHECK(uswap_config_device(cfg, "zram:1G"));
    CHECK(uswap_config_fault_mode(cfg, mode));
    uswap_swap *swap = NULL;
    CHECK(uswap_open(cfg, &swap));

    uswap_region *region = NULL;
    CHECK(uswap_map(swap, len, &region));
    unsigned char *p = uswap_region_addr(region);
    if (uswap_region_len(region) != len) {
        fprintf(stderr, "length %zu, asked %zu\n", uswap_region_len(region), len);
        return 3;
    }
    for (size_t i = 0; i < len; i++) p[i] = byte_at(i);
    for (size_t i = 0; i < len; i++) {
        if (p[i] != byte_at(i)) {
            fprintf(stderr, "byte %zu differs\n", i);
            return 4;
        }
    }
    uswap_stats st;
    CHECK(uswap_stats_get(swap, &st));
    printf("budget %llu resident %llu peak %llu evictions %llu swapins %llu readahead %llu written %llu\n",
           (unsigned long long)st.budget_bytes, (unsigned long long)st.resident_bytes,
           (unsigned long long)st.peak_resident_bytes, (unsigned long long)st.evictions,
           (unsigned long long)st.swapins, (unsigned long long)st.readahead,
           (unsigned long long)st.io_write_bytes);
    if (st.evictions < len / 4096 / 2 || st.peak_resident_bytes > len / 4 + (len / 40) + (4 << 20)) {
        fprintf(stderr, "not paged under the budget\n");
        return 5;
    }
    /* Discard the first page: zeros again. */
    CHECK(uswap_discard(region, 0, 4096));
    for (size_t i = 0; i < 4096; i++) {
        if (p[i] != 0) {
            fprintf(stderr, "a discarded page reads %d\n", p[i]);
            return 6;
        }
    }
    /* A smaller budget: what is over it goes out. */
    CHECK(uswap_set_budget(swap, len / 8));
    CHECK(uswap_stats_get(swap, &st));
    if (st.budget_bytes != len / 8) {
        fprintf(stderr, "budget %llu after set_budget\n", (unsigned long long)st.budget_bytes);
        return 7;
    }

    /* Each error code a caller can provoke. */
    expect("a NULL config", uswap_config_budget(NULL, 1 << 20), USWAP_ERR_NULL);
    expect("a budget under a page", uswap_config_budget(cfg, 100), USWAP_ERR_INVALID);
    expect("a bad spec", uswap_config_device(cfg, "disk:4G"), USWAP_ERR_SPEC);
    expect("a 0-byte region", uswap_map(swap, 0, &region), USWAP_ERR_INVALID);
    expect("a discard past the end", uswap_discard(region, len, 4096), USWAP_ERR_INVALID);
    uswap_config *bad = uswap_config_new();
    CHECK(uswap_config_device(bad, "file:/nonexistent-dir/x.swap:64M"));
    uswap_swap *none = NULL;
    expect("a swap file that cannot be made", uswap_open(bad, &none), USWAP_ERR_DEVICE);
    uswap_config_free(bad);
    static uswap_region *regions[1100];
    size_t n = 0;
    uswap_status s = USWAP_OK;
    for (; n < 1100; n++) {
        s = uswap_map(swap, 4096, &regions[n]);
        if (s != USWAP_OK) break;
    }
    expect("too many regions", s, USWAP_ERR_LIMIT);
    for (size_t i = 0; i < n; i++) CHECK(uswap_unmap(regions[i]));
    /* A thousand regions mapped, written and unmapped: nothing left of
     * them.  (They push the large region's pages out while they live, so
     * what is conserved is its pages, resident or swapped, not either.) */
    uswap_stats before, after;
    CHECK(uswap_stats_get(swap, &before));
    for (int k = 0; k < 1000; k++) {
        uswap_region *r = NULL;
        CHECK(uswap_map(swap, 1 << 20, &r));
        memset(uswap_region_addr(r), k, 1 << 20);
        CHECK(uswap_unmap(r));
    }
    CHECK(uswap_stats_get(swap, &after));
    if (after.swap_used_bytes + after.resident_bytes > before.swap_used_bytes + before.resident_bytes + (1 << 20)) {
        fprintf(stderr, "1000 regions left swap %llu -> %llu, resident %llu -> %llu\n",
                (unsigned long long)before.swap_used_bytes, (unsigned long long)after.swap_used_bytes,
                (unsigned long long)before.resident_bytes, (unsigned long long)after.resident_bytes);
        return 10;
    }
    printf("1000 regions mapped and unmapped, nothing left\n");
    /* A forked child adopts the instance: it sees its parent's memory,
     * swapped-out pages included, and maps regions of its own. */
    pid_t pid = fork();
    if (pid == 0) {
        for (size_t i = 4096; i < len; i += 4093) {
            if (p[i] != byte_at(i)) _exit(1);
        }
        uswap_region *r = NULL;
        if (uswap_map(swap, 8 << 20, &r) != USWAP_OK) _exit(2);
        unsigned char *q = uswap_region_addr(r);
        memset(q, 7, 8 << 20);
        for (size_t i = 0; i < (8 << 20); i++) {
            if (q[i] != 7) _exit(3);
        }
        if (uswap_unmap(r) != USWAP_OK) _exit(4);
        _exit(0);
    }
    int wst = 0;
    waitpid(pid, &wst, 0);
    if (!WIFEXITED(wst) || WEXITSTATUS(wst) != 0) {
        fprintf(stderr, "the forked child failed: status %d\n", wst);
        return 8;
    }
    printf("a forked child read its parent's memory and mapped its own\n");

    /* Closing first is safe: the region keeps the instance. */
    uswap_close(swap);
    for (size_t i = 4096; i < len; i += 4096 * 7) {
        if (p[i] != byte_at(i)) {
            fprintf(stderr, "byte %zu differs after close\n", i);
            return 9;
        }
    }
    CHECK(uswap_unmap(region));
    uswap_config_free(cfg);
    printf("every byte read back as written\n");
    return 0;
}
