#!/bin/sh
# The issue-13 measurements (docs/PERFORMANCE.md, "What encryption
# costs"): a swap file encrypted (the default) against plaintext (the
# ablation plaintext-files), one invocation each, default sizes.
set -e
cd "$(dirname "$0")"
U=../../../target/release/uswap
$U bench pmbench --backend uswap-file --ablate --variants plaintext-files --json-out pmbench-file.json | tee pmbench-file.txt
$U bench seq-write --backend uswap-file --ablate --variants plaintext-files --units 4k,2m --json-out seq-write-file.json | tee seq-write-file.txt
