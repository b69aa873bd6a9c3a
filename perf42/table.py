#!/usr/bin/env python3
# perf42/table.py GLOB...: median over files of busbw ratio ours/native per (p, size, algo), and best-of-ours
import sys, glob, re, statistics, collections, os
POOL = os.environ.get('POOL') == '1'   # native: the median over every run of every binary (the same MPI call)
d = collections.defaultdict(list)   # (tag, p, bytes, algo) -> [busbw]
for pat in sys.argv[1:]:
    for fn in glob.glob(pat):
        m = re.search(r'([^/]+?)_r\d+_p(\d+)_f\d+\.txt$', fn)
        tag, p = m.group(1), int(m.group(2))
        for line in open(fn):
            f = line.split()
            if len(f) >= 9 and f[0].isdigit() and f[2] in ('fp32','bf16','int32'):
                d[(tag, p, int(f[0]), f[5])].append(1.0/float(f[6]))
# per file ratio would be better; use median busbw per algo / median native
tags = sorted({k[0] for k in d}); ps = sorted({k[1] for k in d})
algos = ['ring','rabenseifner','recursive_doubling']
for p in ps:
    sizes = sorted({k[2] for k in d if k[1]==p})
    print(f"\n### p = {p}\n")
    hdr = "| bytes | " + " | ".join(f"{t} {a[:5]}" for t in tags for a in algos) + " | " + " | ".join(f"{t} best" for t in tags) + " |"
    print(hdr); print("|" + "---|" * (hdr.count('|')-1))
    for s in sizes:
        cells=[]; bests=[]
        for t in tags:
            nat = sum((d.get((tt,p,s,'native'),[]) for tt in tags), []) if POOL else d.get((t,p,s,'native'))
            if not nat: cells += ['-']*3; bests.append('-'); continue
            nm = statistics.median(nat); best=0; ba=''
            for a in algos:
                v = d.get((t,p,s,a))
                if v: r = statistics.median(v)/nm; cells.append(f"{r:.2f}");
                else: cells.append('-'); continue
                if r > best: best, ba = r, a
            bests.append(f"**{best:.2f}** {ba[:5]}" if best < 0.95 else f"{best:.2f} {ba[:5]}")
        print(f"| {s} | " + " | ".join(cells) + " | " + " | ".join(bests) + " |")
