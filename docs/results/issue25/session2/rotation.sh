#!/bin/sh
# 4 builds in rotating order, N rounds: default and codegen-units=1, before and after.
set -eu
out=$1; n=$2; mkdir -p $out
V=bare-uffd,zero-fill,swapin-ram,swapcache-hit,zero-fill-2m,swapin-ram-2m
i=1
while [ $i -le $n ]; do
  case $((i % 4)) in
    1) order="old new old-cgu1 new-cgu1";;
    2) order="new-cgu1 old-cgu1 new old";;
    3) order="old-cgu1 new-cgu1 old new";;
    0) order="new old new-cgu1 old-cgu1";;
  esac
  for b in $order; do
    /tmp/uswap-$b bench fault --threads 1 --rounds 5 --variants $V --json-out $out/$b-$i.json > $out/$b-$i.txt
  done
  i=$((i+1))
done
