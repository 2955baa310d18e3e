#!/bin/bash
# Issue 9, paired before/after: the binaries (before: 141fe52, after: the
# issue's last commit, both release builds) alternate, the order flipped
# every pair.  Usage: run.sh BEFORE_BIN AFTER_BIN OUT_DIR
set -u
before=$1 after=$2 out=$3
mkdir -p "$out"
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    bin=$before; [ "$b" = after ] && bin=$after
    "$bin" bench fault --rounds 5 --threads 1 --variants zero-fill,swapcache-hit,swapin-ram \
      --json-out "$out/fault-$b-$i.json" > /dev/null 2>&1 || echo "fault $b $i failed"
  done
done
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    bin=$before; [ "$b" = after ] && bin=$after
    "$bin" bench pmbench --backend uswap --rounds 1 \
      --json-out "$out/pm-$b-$i.json" > /dev/null 2>&1 || echo "pmbench $b $i failed"
  done
done
echo finished
