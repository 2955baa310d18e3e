#!/bin/bash
cd /tmp/pair
for i in 1 2 3 4 5 6; do
  if [ $((i % 2)) = 1 ]; then order="before after2"; else order="after2 before"; fi
  for b in $order; do
    /tmp/uswap-$b bench fault --rounds 5 --threads 1 --variants zero-fill,swapcache-hit,swapin-ram --json-out f2-$b-$i.json > /dev/null 2>&1 || echo "fault $b $i failed"
  done
done
echo finished
