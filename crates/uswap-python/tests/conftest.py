import os

import pytest

# The sizes the numpy tests page: a budget and four times it.  The
# defaults keep `scripts/check` short; `USWAP_TEST_BUDGET=2G` runs them at
# the sizes of docs/history/PERFORMANCE-LOG.md.
BUDGET = os.environ.get("USWAP_TEST_BUDGET", "256M")


def modes():
    """Both fault modes where this user may have handler mode (root, or
    vm.unprivileged_userfaultfd=1); SIGBUS mode alone otherwise."""
    try:
        with open("/proc/sys/vm/unprivileged_userfaultfd") as f:
            unprivileged = f.read().strip() == "1"
    except OSError:
        unprivileged = False
    return ["sigbus", "handler"] if os.geteuid() == 0 or unprivileged else ["sigbus"]


@pytest.fixture(params=modes())
def mode(request):
    return request.param
