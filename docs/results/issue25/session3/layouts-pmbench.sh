#!/bin/sh
# layouts-pmbench.sh OUT ROUNDS BUILD...: pmbench on layout builds (see
# layouts.sh), every named build each round, in an order shuffled each round.
set -eu
out=$1; n=$2; shift 2; mkdir -p $out
i=1
while [ $i -le $n ]; do
  for b in $(printf '%s\n' "$@" | shuf); do
    /tmp/layout/bin/$b bench pmbench --backend ${BACKENDS:-uswap,uswap-zram} --rounds 1 --json-out $out/$b-$i.json > $out/$b-$i.txt
  done
  i=$((i+1))
done
