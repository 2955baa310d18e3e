#!/usr/bin/env python3
"""How `runtimes::go_with_cgo`'s SIGBUS-mode failure was made to happen
(docs/RELIABILITY.md): the test's Go program (`CGO_GO` in
crates/uswap-cli/tests/runtimes.rs, built with cgo in DIR as ./fill,
DIR readable by `nobody`)
under `uswap run --mode sigbus --budget 40M` as `nobody`, N times, each
in a cgroup v1 memory group of its own, its anonymous memory sampled
every 5 ms. Run it beside busy loops for load, as root:

    for k in 1 2 3; do timeout 900 sh -c 'while :; do :; done' & done
    docs/results/issue24/go-under-load.py target/release/uswap DIR 30

A run whose tree passes 60 MiB (the test's bound) prints uswap's
`--stats` and leaves DIR/smaps-RUN.txt: every member's /proc/PID/smaps
at its highest peak. Before 480aa0b: 6 runs in 30 past the bound; after:
none in 40. Each group is removed, even when interrupted."""
import os, subprocess, sys, threading, time

BASE = '/sys/fs/cgroup/memory'
BOUND = 60 << 20
NOBODY = 65534


def run(uswap, cwd, i):
    d = f'{BASE}/uswap-go-load-{os.getpid()}-{i}'
    os.mkdir(d)
    try:
        os.chown(f'{d}/cgroup.procs', NOBODY, NOBODY)

        def enter():
            with open(f'{d}/cgroup.procs', 'w') as f:
                f.write('0')
            os.setgid(NOBODY)
            os.setgroups([])
            os.setuid(NOBODY)

        peak, done = [0], [False]

        def sample():
            while not done[0]:
                try:
                    stat = open(f'{d}/memory.stat').read()
                    rss = int(stat.split('total_rss ')[1].split()[0])
                    if rss > max(peak[0], BOUND):
                        maps = [stat]
                        for pid in open(f'{d}/cgroup.procs').read().split():
                            maps.append(f'{pid}\n' + open(f'/proc/{pid}/smaps').read())
                        open(f'{cwd}/smaps-{i}.txt', 'w').write('\n'.join(maps))
                    peak[0] = max(peak[0], rss)
                except (OSError, IndexError, ValueError):
                    pass
                time.sleep(0.005)

        sampler = threading.Thread(target=sample)
        sampler.start()
        cmd = [uswap, 'run', '--stats', '--mode', 'sigbus', '--budget', '40M', '--', 'sh', '-c', './fill']
        out = subprocess.run(cmd, cwd=cwd, preexec_fn=enter, capture_output=True, text=True)
        done[0] = True
        sampler.join()
        return out, peak[0]
    finally:
        for _ in range(100):
            try:
                os.rmdir(d)
                break
            except OSError:
                time.sleep(0.02)


def main():
    uswap, cwd, n = os.path.abspath(sys.argv[1]), sys.argv[2], int(sys.argv[3])
    for i in range(n):
        out, peak = run(uswap, cwd, i)
        print(f'{i} exit {out.returncode} peak {peak >> 20} MiB', flush=True)
        if peak > BOUND or out.returncode != 0:
            print(out.stderr)


main()
