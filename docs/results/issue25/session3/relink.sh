#!/bin/sh
# relink.sh VERSION SEED: link /tmp/$VERSION's uswap again with .text
# sections shuffled by SEED, into /tmp/layout/bin/VERSION-SEED.
set -eu
v=$1; s=$2
GCCLD=$(rustc --print sysroot)/lib/rustlib/x86_64-unknown-linux-gnu/bin/gcc-ld
args=$(ls /tmp/$v/target/release/deps/uswap-*.linkargs)
mkdir -p /tmp/layout/bin
out=/tmp/layout/bin/$v-$s
sed "/^-o$/{n;s|.*|$out|}" $args > /tmp/layout/args.$v.$s
cd /tmp/$v
xargs -d '\n' -a /tmp/layout/args.$v.$s cc -B$GCCLD -fuse-ld=lld -Wl,--shuffle-sections=.text*=$s
