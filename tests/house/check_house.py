#!/usr/bin/env python3
"""check_house.py SOURCE_DIR: the rules that keep cddp's house in order (docs/ARCHITECTURE.md),
for C (.c, .h) and CUDA (.cu, .cuh) alike.

1. A module's private headers (src/<module>/*.h) are included only by that module's files; every
   other file includes public headers (include/cddp/) and its own module's.
2. The programs in tools/ use only public headers.
3. No circle of files: in the graph where file A points at file B when A calls (or names) a
   function that B defines, no two files of src/ reach each other; nor two files of one program
   of tools/.
4. No source file (.c, .cu) of src/ or tools/ is longer than 700 lines.
5. The floors: a file of src/ calls (or names) functions of its own module and of the modules on
   the floors below it only (FLOORS, lowest first, as docs/ARCHITECTURE.md draws them); a module
   not in FLOORS is a breach until it is given its floor.
6. No device-kind branch above the devices' seam: outside src/tensor/ (the devices), no file of
   src/ or tools/ names a kind of device (CDDP_DEVICE_CPU, _EMU, _CUDA); code above asks a device
   what it can do (cddp_device_host_accessible, cddp_device_platform, ...) instead.
7. The library's seams between its own modules (include/cddp/internal/) are not public: their
   headers export nothing (no CDDP_API), no public header includes them, and no program of
   tools/ does.
8. A tensor's own fields (cddp_tensor.own: its 16-bit copies, its ready hook) are tensor's and
   autograd's: no other file of src/, tools/ or examples/ reads or writes them.
9. The CUDA device's list of the kernels it has (CDDP_CUDA_KERNELS, src/tensor/cuda/cuda.h) is
   the launchers its files define (cddp__cuda_NAME), no more, no fewer.

Prints every breach and exits 1, or says what it checked and exits 0.
"""
import os
import re
import sys

MAX_LINES = 700
FLOORS = ["core", "store", "comm", "tensor", "dcomm", "autograd", "nn", "optim", "data", "io", "ddp"]

src = sys.argv[1] if len(sys.argv) > 1 else "."
bad = []


def sources(top, exts=(".c", ".h", ".cu", ".cuh")):
    for d, _, files in os.walk(os.path.join(src, top)):
        for f in sorted(files):
            if f.endswith(exts):
                yield os.path.join(d, f)


def rel(p):
    return os.path.relpath(p, src)


def strip(text):
    """The code without comments, strings and character constants."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r'"(\\.|[^"\\\n])*"', '""', text)
    return re.sub(r"'(\\.|[^'\\\n])*'", "''", text)


# 1, 2 and 4: includes and lengths.
include = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)
for path in list(sources("src")) + list(sources("tools")):
    text = open(path).read()
    r = rel(path)
    parts = r.split(os.sep)
    for inc in include.findall(text):
        if inc.startswith("cddp/"):
            continue
        if parts[0] == "tools":
            if not os.path.exists(os.path.join(os.path.dirname(path), inc)):
                bad.append(f"{r}: includes \"{inc}\": the programs use only public headers")
            continue
        module = parts[1]
        if inc.split("/")[0] != module:
            bad.append(f"{r}: includes \"{inc}\", a private header of another module")
    lines = text.count("\n")
    if lines > MAX_LINES and path.endswith((".c", ".cu")):
        bad.append(f"{r}: {lines} lines (at most {MAX_LINES}: split it where it has seams)")

# 3: the file graph of src/.
defined = {}  # function name -> file
bodies = {}   # file -> its code
definition = re.compile(r"(^|\n)([A-Za-z_][\w \t\*]*?)\b([A-Za-z_]\w*)\s*\(([^;{}]*)\)\s*\{")


def unnamed_namespaces(code):
    """The spans of C++'s anonymous namespaces: what is defined there is the file's own."""
    spans = []
    for m in re.finditer(r"\bnamespace\s*\{", code):
        depth, i = 1, m.end()
        while depth and i < len(code):
            depth += {"{": 1, "}": -1}.get(code[i], 0)
            i += 1
        spans.append((m.start(), i))
    return spans


for path in sources("src", (".c", ".cu")):
    code = strip(open(path).read())
    bodies[path] = code
    own = unnamed_namespaces(code)
    for m in definition.finditer(code):
        if any(a <= m.start(3) < b for a, b in own):
            continue
        head = m.group(2)
        if "static" in head.split() or m.group(3) in ("if", "for", "while", "switch", "operator"):
            continue
        defined[m.group(3)] = path

word = re.compile(r"\b([A-Za-z_]\w*)\b")
edges = {p: set() for p in bodies}
for path, code in bodies.items():
    for name in set(word.findall(code)):
        target = defined.get(name)
        if target and target != path:
            edges[path].add(target)

# 5: the floors, on the same graph.
def module(p):
    return rel(p).split(os.sep)[1]


for m in sorted({module(p) for p in bodies} - set(FLOORS)):
    bad.append(f"src/{m}: a module without a floor: add it to FLOORS (and docs/ARCHITECTURE.md)")
floor = {m: i for i, m in enumerate(FLOORS)}
for a in sorted(edges):
    for b in sorted(edges[a]):
        ma, mb = module(a), module(b)
        if ma in floor and mb in floor and floor[mb] > floor[ma]:
            via = sorted(n for n, f in defined.items() if f == b and re.search(r"\b%s\b" % n,
                                                                                bodies[a]))
            bad.append(f"{rel(a)} calls {rel(b)} ({', '.join(via[:3])}): {ma} is below {mb}")

# Strongly connected components (Tarjan): every one with more than one file is a circle.
index, low, on, stack, comps, counter = {}, {}, set(), [], [], [0]


def visit(v):
    index[v] = low[v] = counter[0]
    counter[0] += 1
    stack.append(v)
    on.add(v)
    for w in edges[v]:
        if w not in index:
            visit(w)
            low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop()
            on.discard(w)
            comp.append(w)
            if w == v:
                break
        comps.append(comp)


sys.setrecursionlimit(10000)
for v in edges:
    if v not in index:
        visit(v)
for comp in comps:
    if len(comp) > 1:
        names = sorted(rel(p) for p in comp)
        links = []
        for a in comp:
            for b in edges[a]:
                if b in comp:
                    via = sorted(n for n, f in defined.items() if f == b and re.search(
                        r"\b%s\b" % n, bodies[a]))
                    links.append(f"{rel(a)} -> {rel(b)} ({', '.join(via[:3])})")
        bad.append("a circle of files: " + ", ".join(names) + "\n    " + "\n    ".join(sorted(links)))

# 3 again for each program of tools/: no two of its files call each other, round about.
def reach(links, start):
    """The files that start leads to, start among them."""
    seen, todo = set(), [start]
    while todo:
        q = todo.pop()
        if q not in seen:
            seen.add(q)
            todo.extend(links[q])
    return seen


def program_circles(folder):
    files = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".c"))
    code = {p: strip(open(p).read()) for p in files}
    mine = {}
    for p, text in code.items():
        for m in definition.finditer(text):
            if "static" not in m.group(2).split() and m.group(3) not in ("if", "for", "while",
                                                                         "switch"):
                mine[m.group(3)] = p
    links = {p: {mine[n] for n in set(word.findall(text)) if n in mine and mine[n] != p}
             for p, text in code.items()}
    # a file that one of its links leads back to is in a circle
    for p in files:
        back = [q for q in sorted(links[p]) if p in reach(links, q)]
        if back:
            via = ", ".join(f"{os.path.basename(p)} -> {os.path.basename(q)}" for q in back)
            bad.append(f"{rel(p)}: in a circle of files of {rel(folder)} ({via})")


for prog in sorted(os.listdir(os.path.join(src, "tools"))):
    folder = os.path.join(src, "tools", prog)
    if os.path.isdir(folder):
        program_circles(folder)

# 7: include/cddp/internal/ stays internal.
inc_dir = os.path.join(src, "include", "cddp")
internal_headers = 0
if os.path.isdir(inc_dir):
    for d, _, files in os.walk(inc_dir):
        for f in sorted(files):
            if not f.endswith(".h"):
                continue
            path = os.path.join(d, f)
            r = rel(path)
            code = strip(open(path).read())
            inside = os.path.basename(d) == "internal"
            internal_headers += inside
            if inside and re.search(r"\bCDDP_API\b", code):
                bad.append(f"{r}: exports a function (CDDP_API): the library's seams are not "
                           f"its public API")
            if not inside and "cddp/internal/" in open(path).read():
                bad.append(f"{r}: a public header includes cddp/internal/")
for path in sources("tools"):
    if "cddp/internal/" in open(path).read():
        bad.append(f"{rel(path)}: includes cddp/internal/: the programs use the public API only")

# 8: a tensor's own fields.
own_field = re.compile(r"(->|\.)own\.(half|grad_half|ready_hook|ready_user)\b")
for top in ("src", "tools", "examples"):
    for path in sources(top):
        r = rel(path)
        if r.startswith((os.path.join("src", "tensor") + os.sep,
                         os.path.join("src", "autograd") + os.sep)):
            continue
        m = own_field.search(strip(open(path).read()))
        if m:
            bad.append(f"{r}: reads a tensor's own field (own.{m.group(2)}): tensor's and "
                       f"autograd's only (use the accessors of cddp/tensor.h)")

# 9: CDDP_CUDA_KERNELS against the launchers the CUDA files define.
cuda_dir = os.path.join(src, "src", "tensor", "cuda")
cuda_listed = cuda_defined = set()
if os.path.isdir(cuda_dir):
    header = strip(open(os.path.join(cuda_dir, "cuda.h")).read())
    m = re.search(r"#define CDDP_CUDA_KERNELS\(K\)((?:[^\n]*\\\n)*[^\n]*)", header)
    cuda_listed = set(re.findall(r"\bK\((\w+)\)", m.group(1))) if m else set()
    cuda_defined = set()
    for path in sources(os.path.join("src", "tensor", "cuda")):
        cuda_defined |= set(re.findall(r"^void cddp__cuda_(\w+)\(cddp__kq \*q",
                                       strip(open(path).read()), re.M))
    for k in sorted(cuda_listed - cuda_defined):
        bad.append(f"src/tensor/cuda/cuda.h: CDDP_CUDA_KERNELS lists {k}, whose launcher "
                   f"cddp__cuda_{k} no CUDA file defines")
    for k in sorted(cuda_defined - cuda_listed):
        bad.append(f"src/tensor/cuda/cuda.h: cddp__cuda_{k} is defined but not in "
                   f"CDDP_CUDA_KERNELS (the device would not call it)")

# 6: device kinds named above the seam.
kind_name = re.compile(r"\bCDDP_DEVICE_(CPU|EMU|CUDA)\b")
kind_files = 0
for path in list(sources("src")) + list(sources("tools")):
    r = rel(path)
    if r.startswith(os.path.join("src", "tensor") + os.sep):
        continue
    kind_files += 1
    for m in kind_name.finditer(strip(open(path).read())):
        bad.append(f"{r}: names {m.group(0)}: above the devices' seam, ask the device what it "
                   f"can do (cddp/device.h) instead of which kind it is")

if bad:
    print("FAIL: the house rules (docs/ARCHITECTURE.md) are broken:")
    for b in bad:
        print("  " + b)
    sys.exit(1)
print(f"ok: {len(bodies)} files of src/: no private header of another module, no circle "
      f"({sum(len(e) for e in edges.values())} links between files), no call to a floor above "
      f"({len(FLOORS)} floors), none over {MAX_LINES} lines; tools/ on public headers only, "
      f"no circle in a program of tools/; no device kind named in {kind_files} files above the "
      f"devices' seam; {internal_headers} internal header(s) kept internal; "
      f"{len(cuda_listed)} CUDA kernels listed, each defined")
