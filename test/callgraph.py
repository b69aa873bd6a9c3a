#!/usr/bin/env python3
"""Reading sets computed from the code, for test/test_syllabus.py.

A row of the syllabus's reading table names its entry functions and its command. The set of
the row is every function of the trainer's sources that the entries reach by calls, as the
command runs them: the trainer built with -finstrument-functions (build/callgraph/train_gpt2cpu,
test/callgraph_trace.cpp) records each distinct (caller, callee) pair, the caller being the
innermost of our functions running (the library between them, a std::thread or std::function,
skipped), so calls through hooks and function tables count exactly as the command installs them, and a call the command
does not take (another algorithm's branch, an error path) is not followed, as a reader who
follows the command would not. Added to the functions: the types, tables and macros their
bodies and signatures name (one level: a field's own type is read when wanted), defined in the
same sources. A row's cost is the lines of those
definitions plus each file's opening comment; what an earlier row's set holds is not counted
again (the student has read it).

  python3 test/callgraph.py [ENTRY...] -- COMMAND...   one set, printed (a tool for the curious)
"""
import collections
import os
import re
import subprocess
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BINARY = os.path.join(ROOT, "build", "callgraph", "train_gpt2cpu")

Item = collections.namedtuple("Item", "kind name path start end body")   # lines 1-based, inclusive

IDENT = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = set("""if for while switch return sizeof static inline const struct typedef enum union
void int float double char unsigned long short signed size_t auto else do case default break
continue template typename using namespace extern volatile constexpr bool true false new delete
operator class public private protected this nullptr goto decltype noexcept""".split())


def strip_code(text):
    """The source with comments, strings and character literals blanked (newlines kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i)); i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j])); i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            j = min(j + 1, n)
            out.append(c + " " * (j - i - 2) + c if j - i >= 2 else text[i:j]); i = j
        else:
            out.append(c); i += 1
    return "".join(out)


def opening_comment(text):
    """Lines of the comment a file opens with (before its first line of code)."""
    count = 0
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("//") or s.startswith("/*") or s.startswith("*") or s.endswith("*/"):
            count += 1
        elif s == "":
            if count:
                break
        else:
            break
    return count


def parse_file(path):
    """The top-level definitions of one source file: functions, types, tables, macros."""
    text = open(os.path.join(ROOT, path), errors="replace").read()
    code = strip_code(text)
    lines = code.split("\n")
    line_of = [0] * (len(code) + 1)
    ln = 1
    for k, ch in enumerate(code):
        line_of[k] = ln
        if ch == "\n":
            ln += 1
    line_of[len(code)] = ln
    items = []
    # macros: #define NAME (with continuation lines)
    for k, line in enumerate(lines):
        m = re.match(r"\s*#\s*define\s+(\w+)", line)
        if m:
            end = k
            while lines[end].rstrip().endswith("\\") and end + 1 < len(lines):
                end += 1
            items.append(Item("macro", m.group(1), path, k + 1, end + 1, "\n".join(lines[k:end + 1])))
    # blank preprocessor lines out of the top-level scan
    scan = "\n".join(" " * len(l) if re.match(r"\s*#", l) else l for l in lines)
    depth, decl_start, i, n = 0, None, 0, len(scan)
    while i < n:
        c = scan[i]
        if depth == 0 and decl_start is None and not c.isspace():
            decl_start = i
        if c == "{":
            if depth == 0 and decl_start is not None:
                head = scan[decl_start:i]
                close = match_brace(scan, i)
                end = close
                tail = re.match(r"\s*(\w*)\s*(\[[^\]]*\])?\s*;", scan[close + 1:])
                if tail:
                    end = close + 1 + tail.end() - 1
                kind, name = classify(head, tail.group(1) if tail else "")
                if kind:
                    items.append(Item(kind, name, path, line_of[decl_start], line_of[end], scan[decl_start:end + 1]))
                    i, decl_start = end + 1, None
                    continue
                if re.search(r'\bextern\s*"?C?"?\s*$|\bnamespace\b', head):
                    i, decl_start = i + 1, None   # transparent braces
                    continue
                i, decl_start = end + 1, None
                continue
            depth += 1
        elif c == "}":
            depth = max(0, depth - 1)
        elif c == ";" and depth == 0:
            decl_start = None
        i += 1
    return items, opening_comment(text)


def match_brace(s, i):
    depth = 0
    for j in range(i, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(s) - 1


def classify(head, after):
    h = re.sub(r"__attribute__\s*\(\(.*?\)\)", " ", head, flags=re.S)
    h = re.sub(r"\btemplate\s*<[^{;]*?>\s*(?=\w)", " ", h, count=1, flags=re.S)
    t = re.search(r"\b(struct|union|enum|class)\s+(\w+)?\s*(:[^{]*)?$", h.strip())
    if t or re.search(r"\b(struct|union|enum)\s*$", h.strip()):
        name = after if re.match(r"\s*typedef\b", h) and after else (t.group(2) if t and t.group(2) else after)
        return ("type", name) if name else (None, None)
    if "(" in h and "=" not in h.split("(")[0]:
        m = re.search(r"(operator\s*\S+|\w+)\s*$", h.split("(")[0].strip())
        return ("function", m.group(1)) if m else (None, None)
    m = re.search(r"(\w+)\s*(\[[^\]]*\])*\s*=\s*$", h.strip())
    if m:
        return "table", m.group(1)
    return None, None


def sources():
    """The repository files the trainer's translation unit includes (train_gpt2.cu first)."""
    cxx = "mpicxx" if subprocess.run(["sh", "-c", "command -v mpicxx"], capture_output=True).returncode == 0 else "g++"
    flags = ["-std=c++17", "-x", "c++", "-DLLMC_CPU", "-fopenmp"] + (["-DUSE_MPI", "-DOMPI_SKIP_MPICXX"] if cxx == "mpicxx" else [])
    out = subprocess.run([cxx] + flags + ["-MM", "train_gpt2.cu"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = [f for f in out.replace("\\\n", " ").split(":", 1)[1].split() if not f.startswith("/")]
    return [os.path.normpath(f) for f in files]


def definitions(files):
    items, opening = [], {}
    for f in files:
        its, op = parse_file(f)
        items += its
        opening[f] = op
    return items, opening


def base_name(symbol):
    """nm -C's name -> the source name: 'foo(int) [clone ._omp_fn.0]' -> foo, 'main::{lambda()#1}::...' -> main,
    'Bar::baz()' -> Bar (a method is read with its type)."""
    s = re.sub(r"\s*\[clone [^\]]*\]", "", symbol)
    s = s.split("::{lambda", 1)[0]
    depth, out = 0, []
    for ch in s:   # drop template arguments
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    s = "".join(out)
    s = s.split("(", 1)[0].strip()
    s = s.split()[-1] if s.split() else s
    parts = [p for p in s.split("::") if p]
    if len(parts) >= 2 and not parts[0].startswith("std"):
        return parts[0]
    return parts[-1] if parts else s


def symbols(binary):
    out = subprocess.run(["nm", "-C", "-n", "--defined-only", binary], capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        parts = line.split(" ", 2)
        if len(parts) == 3 and parts[1] in "tTwW":
            syms.append((int(parts[0], 16), parts[2]))
    return syms


def edges_of(trace_files, binary):
    import bisect
    syms = symbols(binary)
    starts = [a for a, _ in syms]
    at = {a: s for a, s in syms}
    edges = set()
    for tf in trace_files:
        for line in open(tf):
            if line.startswith("full"):
                raise RuntimeError(f"{tf}: the trace's table filled up")
            caller, callee = (int(x, 16) for x in line.split())
            k = bisect.bisect_right(starts, caller) - 1
            if k < 0 or callee not in at:
                continue
            edges.add((base_name(syms[k][1]), base_name(at[callee])))
    return edges


def run_traced(command, workdir, env_extra=None):
    """Run COMMAND (a list; its ./train_gpt2cpu replaced by the traced build) and return its edges."""
    import glob
    import tempfile
    tmp = tempfile.mkdtemp(prefix="callgraph-")
    cmd = [BINARY if w in ("./train_gpt2cpu", "train_gpt2cpu") else w for w in command]
    env = dict(os.environ, LLMC_CALLGRAPH=f"{tmp}/trace", **(env_extra or {}))
    if "OMPI_MCA_mca_base_env_list" in env:
        env["OMPI_MCA_mca_base_env_list"] += f";LLMC_CALLGRAPH={tmp}/trace"
    elif cmd and "mpirun" in cmd[0]:
        cmd = cmd[:1] + ["-x", "LLMC_CALLGRAPH"] + cmd[1:]
    p = subprocess.run(cmd, cwd=workdir, env=env, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(command)}: exit {p.returncode}: {(p.stdout + p.stderr).strip().splitlines()[-3:]}")
    files = glob.glob(f"{tmp}/trace.*")
    if not files:
        raise RuntimeError(f"{' '.join(command)}: no trace written")
    e = edges_of(files, BINARY)
    for f in files:
        os.remove(f)
    os.rmdir(tmp)
    return e


class Code:
    """The sources' definitions, by name."""

    def __init__(self, files):
        self.items, self.opening = definitions(files)
        self.by_name = collections.defaultdict(list)
        for it in self.items:
            self.by_name[it.name].append(it)
        self.refs = {}

    def names_in(self, item):
        if item not in self.refs:
            self.refs[item] = {w for w in IDENT.findall(item.body) if w not in KEYWORDS and w != item.name}
        return self.refs[item]

    def reach(self, entries, edges):
        """Functions reached from the entries by the recorded calls, then the types, tables and
        macros they name (and those name), as items."""
        calls = collections.defaultdict(set)
        for a, b in edges:
            calls[a].add(b)
        seen, frontier = set(), list(entries)   # the functions reached over the recorded calls
        while frontier:
            f = frontier.pop()
            if f in seen:
                continue
            seen.add(f)
            frontier += [g for g in calls.get(f, ()) if g in self.by_name]
        items = {it for name in seen for it in self.by_name.get(name, []) if it.kind in ("function", "type")}
        for it in list(items):   # what the functions name (one level: a field's own type is read when wanted)
            if it.kind == "function":
                items |= {d for w in self.names_in(it) for d in self.by_name.get(w, []) if d.kind in ("type", "table", "macro")}
        return items

    def cost(self, items, files_read):
        """Lines of the items plus the opening comment of each file they are in that has not been read."""
        lines = sum(it.end - it.start + 1 for it in items)
        new_files = sorted({it.path for it in items} - files_read)
        return lines + sum(self.opening[f] for f in new_files), new_files


def main(argv):
    if "--" not in argv:
        print(__doc__)
        return 2
    k = argv.index("--")
    entries, command = argv[:k], argv[k + 1:]
    code = Code(sources())
    items = code.reach(entries, run_traced(command, ROOT))
    total, files = code.cost(items, set())
    for it in sorted(items, key=lambda x: (x.path, x.start)):
        print(f"{it.path}:{it.name} ({it.kind}) {it.end - it.start + 1}")
    print(f"total {total} lines in {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
