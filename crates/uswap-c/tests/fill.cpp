// uswap from C++: the same header, RAII over the handles, a region four
// times the budget filled through std::fill and checked with std::equal.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "uswap.h"

struct Closer {
    void operator()(uswap_swap *s) const { uswap_close(s); }
};
struct Unmapper {
    void operator()(uswap_region *r) const { uswap_unmap(r); }
};

int main() {
    const size_t len = size_t(128) << 20;
    std::unique_ptr<uswap_config, void (*)(uswap_config *)> cfg(uswap_config_new(), uswap_config_free);
    if (uswap_config_budget(cfg.get(), len / 4) != USWAP_OK || uswap_config_device(cfg.get(), "ram:256M") != USWAP_OK) {
        std::fprintf(stderr, "config: %s\n", uswap_last_error());
        return 1;
    }
    uswap_swap *raw = nullptr;
    if (uswap_open(cfg.get(), &raw) != USWAP_OK) {
        std::fprintf(stderr, "open: %s\n", uswap_last_error());
        return 1;
    }
    std::unique_ptr<uswap_swap, Closer> swap(raw);
    uswap_region *r = nullptr;
    if (uswap_map(swap.get(), len, &r) != USWAP_OK) {
        std::fprintf(stderr, "map: %s\n", uswap_last_error());
        return 1;
    }
    std::unique_ptr<uswap_region, Unmapper> region(r);
    auto *words = static_cast<unsigned long *>(uswap_region_addr(region.get()));
    const size_t n = len / sizeof(unsigned long);
    for (size_t i = 0; i < n; i++) words[i] = i * 0x9e3779b97f4a7c15ul;
    std::vector<unsigned long> want(4096);
    for (size_t base = 0; base < n; base += want.size()) {
        for (size_t j = 0; j < want.size(); j++) want[j] = (base + j) * 0x9e3779b97f4a7c15ul;
        if (!std::equal(want.begin(), want.end(), words + base)) {
            std::fprintf(stderr, "words at %zu differ\n", base);
            return 2;
        }
    }
    uswap_stats st{};
    uswap_stats_get(swap.get(), &st);
    if (st.evictions < len / 4096 / 2) {
        std::fprintf(stderr, "only %llu evictions\n", (unsigned long long)st.evictions);
        return 3;
    }
    std::printf("c++: %llu evictions, every word read back\n", (unsigned long long)st.evictions);
    return 0;
}
