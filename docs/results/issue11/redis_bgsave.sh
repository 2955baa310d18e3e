#!/usr/bin/env bash
# Redis BGSAVE (a fork whose child writes every key to an RDB file) with
# and without uswap: for each round and each runner, a fresh redis-server,
# DEBUG POPULATE of KEYS keys of 256 bytes, then BGSAVE, timed from the
# command to the end of the save; the RDB must restore to the same DEBUG
# DIGEST.  Usage: redis_bgsave.sh USWAP KEYS ROUNDS BUDGET
# (e.g. target/release/uswap 150000 3 16M).  Prints one line per run.
set -euo pipefail
uswap=$1 keys=$2 rounds=$3 budget=$4
dir=$(mktemp -d)
trap 'redis-cli -p 7790 shutdown nosave >/dev/null 2>&1 || true; rm -rf "$dir"' EXIT
ready() { for _ in $(seq 1 200); do [ "$(redis-cli -p "$1" ping 2>/dev/null)" = PONG ] && return; sleep 0.05; done; echo "no redis on $1" >&2; exit 1; }
args=(--port 7790 --save "" --enable-debug-command local --dir "$dir" --dbfilename dump.rdb --logfile "")
for round in $(seq 1 "$rounds"); do
    for runner in plain uswap-handler uswap-sigbus; do
        rm -f "$dir"/*.rdb
        case $runner in
            plain) redis-server "${args[@]}" >/dev/null 2>&1 & ;;
            uswap-handler) "$uswap" run --mode handler --budget "$budget" --swap ram:512M -- redis-server "${args[@]}" >/dev/null 2>&1 & ;;
            uswap-sigbus) "$uswap" run --mode sigbus --budget "$budget" --swap ram:512M -- redis-server "${args[@]}" >/dev/null 2>&1 & ;;
        esac
        ready 7790
        redis-cli -p 7790 debug populate "$keys" key 256 >/dev/null
        want=$(redis-cli -p 7790 debug digest)
        start=$(date +%s.%N)
        redis-cli -p 7790 bgsave >/dev/null
        while redis-cli -p 7790 info persistence | grep -q "rdb_bgsave_in_progress:1"; do sleep 0.02; done
        took=$(echo "$(date +%s.%N) - $start" | bc)
        redis-cli -p 7790 info persistence | grep -q "rdb_last_bgsave_status:ok"
        redis-cli -p 7790 shutdown nosave >/dev/null 2>&1 || true
        wait
        redis-server "${args[@]}" >/dev/null 2>&1 &
        ready 7790
        got=$(redis-cli -p 7790 debug digest)
        redis-cli -p 7790 shutdown nosave >/dev/null 2>&1 || true
        wait
        [ "$got" = "$want" ] || { echo "round $round $runner: the RDB differs" >&2; exit 1; }
        echo "round $round $runner bgsave_s $took"
    done
done
