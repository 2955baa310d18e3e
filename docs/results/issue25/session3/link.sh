#!/bin/sh
# Linker wrapper: links with rust-lld, shuffling .text input sections by $SEED
# (from /tmp/layout/seed), and saves the command so it can be re-run.
GCCLD=/root/.rustup/toolchains/1.95.0-x86_64-unknown-linux-gnu/lib/rustlib/x86_64-unknown-linux-gnu/bin/gcc-ld
seed=$(cat /tmp/layout/seed 2>/dev/null || echo 1)
out=""
prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
case "$out" in */uswap-*) ;; esac
printf '%s\n' "$@" > "$out.linkargs"
exec cc -B$GCCLD -fuse-ld=lld -Wl,--shuffle-sections=.text*=$seed "$@"
