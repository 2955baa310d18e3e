#!/bin/sh
set -eu
out=$1; n=$2; shift 2; mkdir -p $out
V=${V:-zero-fill,zero-fill-2m,swapin-ram-2m}
i=1
while [ $i -le $n ]; do
  if [ $((i % 2)) -eq 1 ]; then order="$*"; else order=$(echo "$*" | tr ' ' '\n' | tac | tr '\n' ' '); fi
  for b in $order; do
    /tmp/uswap-$b bench fault --threads 1 --rounds 5 --variants $V --json-out $out/$b-$i.json > $out/$b-$i.txt
  done
  i=$((i+1))
done
