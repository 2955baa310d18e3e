#!/bin/sh
# Short pmbench runs, one after another, each watched: a run that has not
# ended 120 s after it began (it should take about 10 s) is a hang; every
# uswap process's threads are then dumped with gdb (user stacks) and
# /proc (kernel stacks), and the loop stops.  Usage: pmbench-loop.sh RUNS
set -u
cd "$(dirname "$0")"
U=../../../target/release/uswap
RUNS=${1:-100}
out=pmbench-loop.log
: > $out
i=0
while [ $i -lt "$RUNS" ]; do
    i=$((i + 1))
    backend=uswap; [ $((i % 3)) = 0 ] && backend=uswap-file
    start=$(date +%s)
    $U bench pmbench --backend $backend --wss 512M --budget 128M --seconds 2 --rounds 1 > /tmp/pmbench-one.log 2>&1 &
    pid=$!
    while kill -0 $pid 2>/dev/null; do
        if [ $(( $(date +%s) - start )) -gt 120 ]; then
            echo "run $i ($backend): HUNG after 120 s" | tee -a $out
            for p in $(pgrep -f "uswap bench"); do
                echo "== process $p" >> $out
                for t in /proc/$p/task/*; do echo "-- $t $(cat $t/comm) $(cat $t/wchan)"; cat $t/stack; done >> $out 2>&1
                timeout 60 gdb -p $p -batch -nx -ex "thread apply all bt" >> $out 2>&1
            done
            cat /tmp/pmbench-one.log >> $out
            kill -9 $(pgrep -f "uswap bench") 2>/dev/null
            exit 1
        fi
        sleep 1
    done
    wait $pid; rc=$?
    echo "run $i ($backend): rc $rc in $(( $(date +%s) - start )) s" >> $out
    [ $rc = 0 ] || { cat /tmp/pmbench-one.log >> $out; echo "run $i failed" | tee -a $out; exit 1; }
done
echo "$RUNS runs, no hang" | tee -a $out
