#!/bin/sh
# The issue-12 measurements (docs/PERFORMANCE.md, "Compressed RAM"), one
# invocation each, default sizes (pmbench: 2 GiB working set, 512 MiB
# budget, 8 s, 2 rounds, 2 threads).  Root (kernel backends).
set -e
cd "$(dirname "$0")"
U=../../../target/release/uswap
$U bench pmbench --backend uswap,uswap-zram,kernel-zram --zram-algorithm lz4 --data text --json-out text-lz4.json | tee text-lz4.txt
$U bench pmbench --backend uswap-zram,kernel-zram --zram-algorithm lz4 --codec zstd --data text --json-out text-zstd.json | tee text-zstd.txt
$U bench pmbench --backend uswap,uswap-zram,kernel-zram --zram-algorithm lz4 --data random --json-out random.json | tee random.txt
$U bench pmbench --backend uswap-zram-file,kernel-zswap --data text --json-out tier.json | tee tier.txt
$U bench pmbench --backend uswap-zram --ablate --variants zram-keeps-copies --data text --json-out keep-copies-text.json | tee keep-copies-text.txt
$U bench pmbench --backend uswap-zram --ablate --variants zram-keeps-copies --data random --json-out keep-copies-random.json | tee keep-copies-random.txt
$U bench codec --rounds 3 --json-out codec-text.json | tee codec-text.txt
$U bench codec --rounds 3 --data random --json-out codec-random.json | tee codec-random.txt
$U bench seq-write --backend uswap,uswap-zram,kernel-zram --zram-algorithm lz4 --data text --units 4k --seconds 10 --rounds 1 --json-out seq-write.json | tee seq-write.txt
$U bench activate --backend uswap,uswap-zram,kernel-zram --zram-algorithm lz4 --data text --rounds 1 --json-out activate.json | tee activate.txt
