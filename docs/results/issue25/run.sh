#!/bin/sh
# Paired before/after runs for issue 25 (the house, again): the release
# binaries before and after, alternately, the order flipped every pair.
#   run.sh OLD_USWAP NEW_USWAP OUT_DIR PAIRS
set -eu
old=$1 new=$2 out=$3 pairs=${4:-3}
mkdir -p "$out"
fault() { "$1" bench fault --threads 1 --rounds 5 --json-out "$2.json" > "$2.txt"; }
pm() { "$1" bench pmbench --backend uswap,uswap-zram --rounds 2 --json-out "$2.json" > "$2.txt"; }
i=1
while [ "$i" -le "$pairs" ]; do
    if [ $((i % 2)) -eq 1 ]; then
        fault "$old" "$out/old$i"; fault "$new" "$out/new$i"
        pm "$old" "$out/pold$i"; pm "$new" "$out/pnew$i"
    else
        fault "$new" "$out/new$i"; fault "$old" "$out/old$i"
        pm "$new" "$out/pnew$i"; pm "$old" "$out/pold$i"
    fi
    i=$((i + 1))
done
