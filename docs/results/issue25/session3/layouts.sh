#!/bin/sh
# layouts.sh OUT ROUNDS: the fault variants of each layout build in
# /tmp/layout/bin (one source, .text shuffled by seed, see relink.sh), all
# of them each round, in an order shuffled each round.
set -eu
out=$1; n=$2; mkdir -p $out
V=${V:-zero-fill,zero-fill-2m,swapin-ram-2m}
i=1
while [ $i -le $n ]; do
  for b in $(ls /tmp/layout/bin | shuf); do
    /tmp/layout/bin/$b bench fault --threads 1 --rounds 5 --variants $V --json-out $out/$b-$i.json > $out/$b-$i.txt
  done
  i=$((i+1))
done
