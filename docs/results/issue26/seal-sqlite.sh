#!/bin/sh
# Adaptive sealing on a whole program: sqlite3 building an index at three
# times its budget (scripts/bench-programs' db.sql), uswap SIGBUS mode with
# a compressed store left out of the budget, this build (adaptive) against
# a build that seals every page (SwapBuilder::adaptive_seal(false) by
# default, at $ALT), and kernel zram, interleaved, $ROUNDS rounds.
#   ALT=path/to/always-seal/uswap ROUNDS=3 docs/results/issue26/seal-sqlite.sh DIR_WITH_db.sql
set -e
new=${NEW:-$PWD/target/release/uswap}
cd "$1"
for r in $(seq "${ROUNDS:-3}"); do
    for b in "$new" "$ALT"; do
        /usr/bin/time -f "$(basename "$(dirname "$(dirname "$b")")") round $r: %e s wall, %U s user, %S s sys" \
            "$b" run --mode sigbus --budget 20M --swap zram:160M --store-outside-budget \
            --stats-json "stats-$r-$(basename "$(dirname "$(dirname "$b")")").json" \
            -- sqlite3 :memory: ".read db.sql" >/dev/null
    done
    "$new" bench program --budget 20M --rounds 1 --runner kernel-zram -- sqlite3 :memory: ".read db.sql" 2>&1 | grep "^kernel-zram"
done
