#!/bin/bash
# Paired before/after: the binaries alternate, order flipped each pair.
set -u
cd /tmp/pair
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    /tmp/uswap-$b bench fault --rounds 3 --threads 1,2 --json-out fault-$b-$i.json > /dev/null 2>&1 || echo "fault $b $i failed"
  done
done
for i in 1 2 3 4; do
  if [ $((i % 2)) = 1 ]; then order="before after"; else order="after before"; fi
  for b in $order; do
    /tmp/uswap-$b bench pmbench --backend uswap --rounds 1 --json-out pm-$b-$i.json > /dev/null 2>&1 || echo "pmbench $b $i failed"
  done
done
echo finished
