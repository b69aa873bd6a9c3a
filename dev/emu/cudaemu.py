#!/usr/bin/env python3
"""The emulator's source rewrite (dev/emu/README.md): the three CUDA constructs g++ cannot read.

  kernel<<<grid, block, smem, stream>>>(args)  ->  ::emu::launch(::emu::Config(grid, block, smem, stream), kernel, args)
  extern __shared__ T name[];                  ->  T* name = (T*)::emu::dynamic_smem();
  asm volatile("mma.sync... {%0,..}, ..." : "+f"(c[0]), .. : "r"(a[0]), ..)
                                               ->  ::emu::ptx::mma_sync_...(&c[0], .., a[0], ..)   (emu_ptx.h)
and, so that every block starts with garbage in its shared memory as on a GPU,
  __shared__ float s[8][33];                   ->  the same (static, by the header) + ::emu::poison_shared(&s, sizeof(s));

Everything else is left as it is: the rest of CUDA C++ is C++ that g++ compiles against the
toolkit's headers and dev/emu/cuda_emu.h. Line numbers are kept (every rewrite keeps the
number of newlines) and each output starts with #line, so compiler messages, __FILE__ and
sanitizer reports name the original file and line.

usage: cudaemu.py --root REPO --out DIR FILE...   writes DIR/<FILE relative to REPO>, rewritten
"""
import argparse
import os
import re
import sys


class RewriteError(Exception):
    pass


def code_mask(text):
    """A copy of text with comments, string and character literals blanked (newlines kept), so
    that searches only see code."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        elif c == '"' or c == "'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            for k in range(i, min(j + 1, n)):
                if out[k] != "\n":
                    out[k] = " "
            i = j + 1
        else:
            i += 1
    return "".join(out)


def match_forward(mask, i, open_ch, close_ch):
    """index of the bracket closing the one at mask[i]"""
    depth = 0
    for j in range(i, len(mask)):
        if mask[j] == open_ch:
            depth += 1
        elif mask[j] == close_ch:
            depth -= 1
            if depth == 0:
                return j
    raise RewriteError("unbalanced '%s'" % open_ch)


def kernel_start(mask, end):
    """start of the kernel expression that ends just before mask[end] (name, ::, template args)"""
    i = end - 1
    while i >= 0 and mask[i].isspace():
        i -= 1
    start = i + 1
    while i >= 0:
        if mask[i] == ">":   # template arguments: back to the matching '<'
            depth = 0
            while i >= 0:
                if mask[i] in ">)]":
                    depth += 1
                elif mask[i] in "<([":
                    depth -= 1
                    if depth == 0:
                        break
                i -= 1
            i -= 1
            while i >= 0 and mask[i].isspace():
                i -= 1
        if i >= 0 and (mask[i].isalnum() or mask[i] == "_"):
            while i >= 0 and (mask[i].isalnum() or mask[i] == "_"):
                i -= 1
            start = i + 1
            j = i
            while j >= 0 and mask[j].isspace():
                j -= 1
            if j >= 1 and mask[j] == ":" and mask[j - 1] == ":":
                i = j - 2
                while i >= 0 and mask[i].isspace():
                    i -= 1
                start = j - 1
                continue
            return start
        return start
    return start


def split_top(s, sep):
    """split s at separators outside (), [], {}"""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def rewrite_launches(text):
    mask = code_mask(text)
    out, pos = [], 0
    for m in re.finditer(r"<<<", mask):
        if m.start() < pos:
            continue
        close = mask.find(">>>", m.end())
        if close < 0:
            raise RewriteError("'<<<' without '>>>'")
        k0 = kernel_start(mask, m.start())
        kernel = text[k0:m.start()].strip()
        if not kernel:
            raise RewriteError("cannot find the kernel name before '<<<'")
        cfg = text[m.end():close]
        p = close + 3
        while p < len(mask) and mask[p].isspace():
            p += 1
        if p >= len(mask) or mask[p] != "(":
            raise RewriteError("a launch '%s<<<...>>>' is not followed by its arguments" % kernel)
        q = match_forward(mask, p, "(", ")")
        args = text[p + 1:q]
        lead = text[k0:m.start()][: len(text[k0:m.start()]) - len(text[k0:m.start()].lstrip())]
        between = text[close + 3:p]   # whitespace (newlines kept)
        call = "%s::emu::launch(::emu::Config(%s), %s%s" % (lead, cfg, kernel, between)
        call += (", " + args if args.strip() else "") + ")"
        out.append(text[pos:k0])
        out.append(call)
        pos = q + 1
    out.append(text[pos:])
    return "".join(out)


def parse_operands(s):
    ops = []
    for part in split_top(s, ","):
        part = part.strip()
        if not part:
            continue
        m = re.match(r'^"([^"]*)"\s*\((.*)\)$', part, re.S)
        if not m:
            raise RewriteError("cannot read the asm operand '%s'" % part)
        ops.append((m.group(1), m.group(2).strip()))
    return ops


def rewrite_asm_statement(body):
    """body: the text inside asm(...). Returns the replacement call."""
    sections = split_top(body, ":")
    strings = re.findall(r'"((?:[^"\\]|\\.)*)"', sections[0])
    if not strings:
        raise RewriteError("asm statement without an instruction string")
    template = "".join(strings).replace("\\n", "\n").replace("\\t", " ")
    instrs = [s.strip() for s in template.split(";") if s.strip()]
    if len(instrs) != 1:
        raise RewriteError("asm with %d instructions: the emulator takes one per statement" % len(instrs))
    instr = instrs[0]
    mnemonic = instr.split()[0]
    outputs = parse_operands(sections[1]) if len(sections) > 1 else []
    inputs = parse_operands(sections[2]) if len(sections) > 2 else []
    operands = outputs + inputs
    seen, args = set(), []
    for ref in re.findall(r"%(\d+)", instr[len(mnemonic):]):
        k = int(ref)
        if k >= len(operands):
            raise RewriteError("asm operand %%%d does not exist" % k)
        constraint, expr = operands[k]
        if k < len(outputs) and k not in seen:
            if not (constraint.startswith("=") or constraint.startswith("+")):
                raise RewriteError("asm output operand %%%d has constraint '%s'" % (k, constraint))
            args.append("&(%s)" % expr)
        else:
            args.append("(%s)" % expr)
        seen.add(k)
    name = re.sub(r"[^A-Za-z0-9]", "_", mnemonic)
    return "::emu::ptx::%s(%s)" % (name, ", ".join(args))


def rewrite_asm(text):
    mask = code_mask(text)
    out, pos = [], 0
    for m in re.finditer(r"\b(asm|__asm__)\b(\s+(volatile|__volatile__))?\s*\(", mask):
        if m.start() < pos:
            continue
        p = m.end() - 1
        q = match_forward(mask, p, "(", ")")
        call = rewrite_asm_statement(text[p + 1:q])
        original = text[m.start():q + 1]
        out.append(text[pos:m.start()])
        out.append(call + "\n" * original.count("\n"))
        pos = q + 1
    out.append(text[pos:])
    return "".join(out)


def rewrite_shared(text):
    mask = code_mask(text)
    out, pos = [], 0
    for m in re.finditer(r"\b__shared__\b", mask):
        if m.start() < pos:
            continue
        semi = mask.find(";", m.end())
        if semi < 0:
            raise RewriteError("__shared__ declaration without ';'")
        before = mask[:m.start()]
        is_extern = re.search(r"\bextern\s+$", before) is not None
        depth = before.count("{") - before.count("}")
        decl = text[m.end():semi]
        if is_extern:
            e = re.search(r"\bextern\s+$", before).start()
            dm = re.match(r"^\s*(.*?)\s*([A-Za-z_]\w*)\s*\[\s*\]\s*$", re.sub(r"__align__\s*\(\s*\d+\s*\)", "", decl), re.S)
            if not dm or depth == 0:
                raise RewriteError("cannot read the extern __shared__ declaration '%s' (an unsized array in a kernel)" % decl.strip())
            ty, name = dm.group(1).strip(), dm.group(2)
            out.append(text[pos:e])
            out.append("%s* %s = (%s*)::emu::dynamic_smem();" % (ty, name, ty) + "\n" * decl.count("\n"))
            pos = semi + 1
            continue
        if depth == 0 or "=" in decl:
            continue   # namespace-scope shared variables are left alone (none in this project)
        names = []
        for part in split_top(decl, ","):
            head = part.split("[")[0]
            ids = re.findall(r"[A-Za-z_]\w*", head)
            if ids:
                names.append(ids[-1])
        poison = "".join(" ::emu::poison_shared(&%s, sizeof(%s));" % (n, n) for n in names)
        out.append(text[pos:semi + 1])
        out.append(poison)
        pos = semi + 1
    out.append(text[pos:])
    return "".join(out)


def rewrite(text):
    return rewrite_launches(rewrite_asm(rewrite_shared(text)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", required=True, help="the repository root (outputs keep paths relative to it)")
    ap.add_argument("--out", required=True, help="output directory")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    root = os.path.abspath(a.root)
    for f in a.files:
        path = os.path.abspath(f)
        rel = os.path.relpath(path, root)
        with open(path) as fh:
            text = fh.read()
        try:
            new = rewrite(text)
        except RewriteError as e:
            print("cudaemu.py: %s: %s" % (rel, e), file=sys.stderr)
            sys.exit(1)
        if new.count("\n") != text.count("\n"):
            print("cudaemu.py: %s: internal error: the line count changed" % rel, file=sys.stderr)
            sys.exit(1)
        dst = os.path.join(a.out, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        content = '#line 1 "%s"\n%s' % (rel, new)
        old = None
        if os.path.exists(dst):
            with open(dst) as fh:
                old = fh.read()
        if old != content:   # unchanged outputs keep their time stamps
            tmp = dst + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(content)
            os.replace(tmp, dst)


if __name__ == "__main__":
    main()
