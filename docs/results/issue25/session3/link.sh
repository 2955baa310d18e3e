#!/bin/sh
# Linker wrapper for the layout experiment (issue 25, third session): links
# with rust-lld, shuffling .text input sections by the seed in
# /tmp/layout/seed (1 if none), and saves the arguments beside the output
# (OUT.linkargs) so that relink.sh can link the same objects again with
# another seed.  Build with
#   RUSTFLAGS="-C save-temps -C linker=$PWD/link.sh -C linker-flavor=gcc"
# (save-temps keeps the objects the saved arguments name).
GCCLD=$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/gcc-ld
seed=$(cat /tmp/layout/seed 2>/dev/null || echo 1)
out=""
prev=""
for a in "$@"; do [ "$prev" = "-o" ] && out=$a; prev=$a; done
printf '%s\n' "$@" > "$out.linkargs"
exec cc -B"$GCCLD" -fuse-ld=lld -Wl,--shuffle-sections=.text*=$seed "$@"
