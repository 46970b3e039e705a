#!/usr/bin/env python3
"""Static checks of every kernel a CUDA translation unit instantiates, without a GPU.

1. Launch resources, from ptxas (-Xptxas -v) for each architecture (default sm_80, sm_90, sm_100)
   and the PTX's .maxntid (what __launch_bounds__ sets):
   - every kernel has __launch_bounds__ (a .maxntid);
   - registers x threads fit the 65,536 registers of a block;
   - static shared memory fits the 48 KiB a launch gets without an opt-in;
   - nothing spills to local memory, but for the kernels listed in --allow-spills (a file of
     "mangled-name-substrings  reason" lines, the substrings joined by '&');
   - no kernel of more than one thread has a stack frame (an array indexed at run time, a struct
     copied whole: local memory that every thread stores and loads), but for those listed in
     --allow-stack (same format; the reason says why it is cheap or what is pending);
   - registers allow at least 50 % occupancy (32 of an SM's 64 warps resident) at the kernel's
     __launch_bounds__ block size, for kernels of 64 threads or more, but for those listed in
     --occupancy-exceptions (same format; the reason says why occupancy does not decide the
     kernel's time, or what is pending).
2. 128-bit loads: each kernel whose mangled name contains a substring listed in --vector-loads
   (same format) has a 16-byte global load (ld.global[.nc].v4 of 32-bit words or .v2 of 64-bit
   ones) in its PTX, or in a device function it calls. Likewise each kernel listed in
   --vector-stores has a 16-byte global store (st.global.v4 / .v2 of 64-bit words), and each
   listed in --wide-stores one of at least 8 bytes (fp8 runs: st.global.u64 or wider).
3. Divisions: each kernel whose mangled name contains a substring listed in --divisions (lines of
   "substrings  most  reason") has at most `most` floating-point divisions and reciprocals (div.*,
   rcp.rn and the directed roundings) in its PTX and the device functions it calls, each function
   counted once (a division in a per-value helper that nvcc does not inline counts once). An IEEE
   division is a subroutine of about ten instructions and a branch on the GPU; a bucket constant
   computed per value shows up once per element of an unrolled run.
4. No implicit floating-point contraction: the PTX nvcc writes with --fmad=true (its default, and
   what a user's build gets) equals the PTX with --fmad=false. Where they differ, some a * b + c
   in device code was fused by the compiler's choice; such expressions must say which they want
   (fmaf, or __fmul_rn / __fadd_rn), or payloads differ from the host's (docs/architecture.md).

5. Launches (--launches FILE, which the SIMT backend writes: `gradzip_simt_tests
   --simt-record-launches=FILE`, lines of "mangled-name threads dynamic-shared-bytes
   max-dynamic-shared-attribute"): for each kernel of the translation unit that the tests launched,
   - the most threads per block of its launches are within its __launch_bounds__ (.maxntid):
     more fails the launch on a GPU, and the backend, which cannot read the bound, runs it;
   - its static shared memory (ptxas) plus the most dynamic shared memory of its launches fit 48
     KiB, or, where the launch raised cudaFuncAttributeMaxDynamicSharedMemorySize, static plus
     that value fit the architecture's opt-in limit (163 KiB on sm_80, 227 KiB on sm_90 and
     sm_100): the backend knows the dynamic bytes only.
   No kernel of the file matched in the record is itself a failure (the names would disagree).
   Kernels instantiated over a type in an anonymous namespace have no dynamic symbol, so the
   backend cannot name them: they are listed, with those the tests never launch, as unchecked.
   With --all-launched, every kernel of the file must be in the record: a kernel no SIMT test
   runs (or one the backend cannot name) is a failure.

Usage: check_kernels.py --nvcc NVCC [--arch 80 --arch 90 ...] [-I DIR]... [-D DEF]...
                        [--allow-spills FILE] [--allow-stack FILE] [--occupancy-exceptions FILE] [--vector-loads FILE]
                        [--vector-stores FILE] [--wide-stores FILE] [--divisions FILE]
                        [--launches FILE [--all-launched]] SOURCE.cu
Exits 1 and lists every violation; prints a table of the kernels otherwise.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

REGISTERS_PER_BLOCK = 65536
STATIC_SHARED_LIMIT = 48 * 1024
# cudaDevAttrMaxSharedMemoryPerBlockOptin: what static plus opted-in dynamic shared memory may reach
# (CUDA C Programming Guide, "Compute Capabilities": 163 KB on 8.0, 227 KB on 9.0 and 10.0).
OPTIN_SHARED_LIMIT = {"80": 163 * 1024, "90": 227 * 1024, "100": 227 * 1024}
# sm_80, sm_90 and sm_100 alike: a 64 K-register file per SM, 64 resident warps, 32 blocks,
# registers allocated per warp in units of 256.
REGISTERS_PER_SM = 65536
WARPS_PER_SM = 64
BLOCKS_PER_SM = 32
REGISTER_UNIT = 256
MIN_OCCUPANCY = 0.5
VECTOR_LOAD = re.compile(r"\bld\.global(?:\.nc)?(?:\.L\w+::\w+)*\.v(?:4\.(?:f32|b32|u32|s32)|2\.(?:f64|b64|u64|s64))\b")
VECTOR_STORE = re.compile(r"\bst\.global(?:\.L\w+::\w+)*\.v(?:4\.(?:f32|b32|u32|s32)|2\.(?:f64|b64|u64|s64))\b")
WIDE_STORE = re.compile(r"\bst\.global(?:\.L\w+::\w+)*\.(?:v4\.(?:f32|b32|u32|s32)|v2\.(?:f32|b32|u32|s32|f64|b64|u64|s64)|b64|u64|s64|f64)\b")


def register_occupancy(regs, threads):
    """Fraction of an SM's warps resident when registers (and the warp and block limits) decide."""
    warps = (threads + 31) // 32
    per_warp = max(1, -(-regs * 32 // REGISTER_UNIT)) * REGISTER_UNIT
    blocks = min(REGISTERS_PER_SM // per_warp // warps, WARPS_PER_SM // warps, BLOCKS_PER_SM)
    return blocks * warps / WARPS_PER_SM


def calls(body):
    return set(re.findall(r"\bcall(?:\.uni)?\s+(?:\([^)]*\),\s*)?(\w+)", body))


def count_in_calls(functions, name, pattern, seen=None):
    """Matches of pattern in function `name` and in each function it calls (transitively), each
    function counted once."""
    seen = set() if seen is None else seen
    if name in seen or name not in functions:
        return 0
    seen.add(name)
    body = functions[name][2]
    return len(pattern.findall(body)) + sum(count_in_calls(functions, c, pattern, seen) for c in calls(body))


def has_access(functions, name, pattern):
    """Whether function `name` or a function it calls (transitively) has an access matching pattern."""
    return count_in_calls(functions, name, pattern) > 0


# rcp.approx is left out: nvcc writes it for integer divisions (random-k's strata, n / k).
DIVISION = re.compile(r"\b(?:div\.(?:rn|rz|rm|rp|full|approx)|rcp\.(?:rn|rz|rm|rp))(?:\.ftz)?\.f(?:32|64)\b")


def load_limits(path):
    """[(pattern, most, reason)] from lines of "pattern  most  reason"."""
    limits = []
    for pattern, rest in load_allowed(path):
        most, _, reason = rest.partition(" ")
        limits.append((pattern, int(most), reason.strip()))
    return limits


def load_launches(path):
    """{mangled: (threads, dynamic bytes, max dynamic attribute or -1)} from the SIMT backend's record."""
    launches = {}
    with open(path) as f:
        for number, line in enumerate(f, 1):
            parts = line.split()
            if len(parts) != 4:
                raise SystemExit(f"{path}:{number}: expected 'name threads dynamic-bytes attribute', got {line!r}")
            launches[parts[0]] = (int(parts[1]), int(parts[2]), int(parts[3]))
    return launches


def launch_problems(sm, pretty, launch, maxntid, smem):
    """What a recorded launch breaks on architecture sm: threads above the bound, shared memory
    above the limit."""
    threads, dynamic, attribute = launch
    out = []
    if maxntid is not None and threads > maxntid:
        out.append(f"{sm} {pretty}: launched with {threads} threads per block, above its __launch_bounds__ "
                   f"({maxntid}): the launch fails on a GPU")
    if attribute < 0 and smem + dynamic > STATIC_SHARED_LIMIT:
        out.append(f"{sm} {pretty}: {smem} bytes of static shared memory + {dynamic} dynamic = {smem + dynamic} "
                   f"> {STATIC_SHARED_LIMIT} without cudaFuncAttributeMaxDynamicSharedMemorySize")
    limit = OPTIN_SHARED_LIMIT.get(sm[3:], min(OPTIN_SHARED_LIMIT.values()))
    if attribute >= 0 and smem + attribute > limit:
        out.append(f"{sm} {pretty}: {smem} bytes of static shared memory + the {attribute} its launches opt in to "
                   f"= {smem + attribute} > {limit}, the most a block may have on {sm}")
    return out


def demangle(names):
    if not names:
        return {}
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
        return dict(zip(names, out.splitlines()))
    except (OSError, subprocess.CalledProcessError):
        return {n: n for n in names}


def short(name, width=110):
    return name if len(name) <= width else name[: width - 3] + "..."


def parse_ptxas(text):
    """{(arch, mangled): {regs, smem, stack, spill_stores, spill_loads}} from ptxas -v output."""
    kernels = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Compiling entry function '([^']+)' for '(sm_\d+)'", line)
        if m:
            current = (m.group(2), m.group(1))
            kernels[current] = {"regs": 0, "smem": 0, "stack": 0, "spill_stores": 0, "spill_loads": 0}
            continue
        if current is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            k = kernels[current]
            k["stack"], k["spill_stores"], k["spill_loads"] = map(int, m.groups())
            continue
        m = re.search(r"Used (\d+) registers", line)
        if m:
            kernels[current]["regs"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            kernels[current]["smem"] = int(s.group(1)) if s else 0
            current = None
    return kernels


def ptx_functions(text):
    """{mangled name: (kind, maxntid or None, body text)} for every .entry and .func of a PTX file."""
    functions = {}
    starts = [m for m in re.finditer(r"^(?:\.visible |\.weak |\.extern )*\.(entry|func)\s+(?:\([^)]*\)\s*)?(\S+?)\s*\(",
                                      text, re.M)]
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(text)
        chunk = text[m.start():end]
        brace = chunk.find("{")
        head = chunk if brace < 0 else chunk[:brace]
        t = re.search(r"\.maxntid\s+(\d+)(?:,\s*(\d+))?(?:,\s*(\d+))?", head)  # "x, y, z", or "x" (PTX 8.7+)
        maxntid = int(t.group(1)) * int(t.group(2) or 1) * int(t.group(3) or 1) if t else None
        body = "\n".join(l for l in chunk.splitlines() if not l.lstrip().startswith("//"))
        functions[m.group(2)] = (m.group(1), maxntid, body)
    return functions


def normalized(body):
    """A function's PTX with the rounding modifiers of add, sub and mul removed (--fmad=false writes
    them on every operation, so they differ where nothing was fused) and registers renumbered."""
    body = stable_name("\n".join(l for l in body.splitlines() if not l.lstrip().startswith((".loc", ".file"))))
    body = re.sub(r"\b(add|sub|mul)\.rn\.(f32|f64)\b", r"\1.\2", body)
    return re.sub(r"%(\w+?)\d+", r"%\1", body)


def stable_name(mangled):
    """A mangled name without nvcc's per-compilation anonymous-namespace tag (which has a hash and
    a process id in it, and so differs between two compilations of one file)."""
    out, at = [], 0
    for m in re.finditer(r"(\d+)_GLOBAL__N__", mangled):
        if m.start() < at:
            continue
        out.append(mangled[at:m.start()] + "ANON")
        at = m.start() + len(m.group(1)) + int(m.group(1))
    return "".join(out) + mangled[at:]


def file_table(text):
    return {m.group(1): m.group(2) for m in re.finditer(r'^\s*\.file\s+(\d+)\s+"([^"]+)"', text, re.M)}


def fma_sites(body, files):
    """Source lines (file:line, from -lineinfo's .loc) of each fma.rn.f32/f64 in a function."""
    sites, where = [], "?"
    for line in body.splitlines():
        m = re.match(r"\s*\.loc\s+(\d+)\s+(\d+)", line)
        if m:
            where = f"{os.path.relpath(files.get(m.group(1), '?'))}:{m.group(2)}"
        elif re.search(r"\bfma\.rn\.f(?:32|64)\b", line):
            sites.append(where)
    return sites


def fusable_pairs(body, files=None):
    """mul.fXX without a rounding mode whose result an add/sub.fXX without one reads: ptxas may
    contract them. Returns 'mul -> add at file:line' descriptions."""
    products = {}
    pairs = []
    where = "?"
    for line in body.splitlines():
        line = line.strip()
        loc = re.match(r"\.loc\s+(\d+)\s+(\d+)", line)
        if loc:
            where = f"{os.path.relpath((files or {}).get(loc.group(1), '?'))}:{loc.group(2)}"
            continue
        m = re.match(r"mul\.(f32|f64)\s+(%\w+),", line)
        if m:
            products[m.group(2)] = line
            continue
        m = re.match(r"(?:add|sub)\.(f32|f64)\s+%\w+,\s*(%\w+),\s*(%\w+)", line)
        if m:
            for r in (m.group(2), m.group(3)):
                if r in products:
                    pairs.append(f"{products[r]} -> {line} at {where}")
    return pairs


def matches(pattern, mangled):
    """A list entry names a kernel by substrings of its mangled name joined by '&', all present."""
    return all(part in mangled for part in pattern.split("&"))


def excepted(entries, mangled):
    """Whether an exception list (load_allowed) names the kernel."""
    return any(matches(p, mangled) for p, _ in entries)


def load_allowed(path):
    allowed = []
    if path:
        with open(path) as f:
            for line in f:
                line = line.split("#", 1)[0].strip()
                if line:
                    pattern, _, reason = line.partition(" ")
                    allowed.append((pattern, reason.strip()))
    return allowed


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nvcc", required=True)
    ap.add_argument("--arch", action="append", default=[])
    ap.add_argument("-I", dest="includes", action="append", default=[])
    ap.add_argument("-D", dest="defines", action="append", default=[])
    ap.add_argument("--allow-spills")
    ap.add_argument("--allow-stack")
    ap.add_argument("--occupancy-exceptions")
    ap.add_argument("--vector-loads")
    ap.add_argument("--vector-stores")
    ap.add_argument("--wide-stores")
    ap.add_argument("--divisions")
    ap.add_argument("--launches")
    ap.add_argument("--all-launched", action="store_true",
                    help="with --launches: a kernel of the file that no SIMT test launched is a failure")
    ap.add_argument("--no-contraction-check", action="store_true")
    ap.add_argument("--namespace", default="gradzip::",
                    help="check the kernels of this namespace only (CUB's own kernels are CUB's business)")
    ap.add_argument("source")
    args = ap.parse_args()
    if args.all_launched and not args.launches:
        ap.error("--all-launched needs --launches FILE")
    archs = args.arch or ["80", "90", "100"]
    common = ["-std=c++17", "-O3", "-lineinfo"] + [f"-I{d}" for d in args.includes] + \
             [f"-D{d}" for d in args.defines]
    name = os.path.basename(args.source)
    stem = os.path.splitext(name)[0]
    problems = []
    with tempfile.TemporaryDirectory() as keep:
        # --fatbin: nvcc compiles the device code only. The host pass of -c would cost as much again
        # (test_device.cu: 264 s against 144 s) for an object file nobody reads.
        cmd = [args.nvcc, "--fatbin", "-Xptxas", "-v", "--keep", "--keep-dir", keep,
               "-o", os.path.join(keep, "out.fatbin")] + \
              common + [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs] + [args.source]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            sys.stderr.write(run.stdout + run.stderr)
            print(f"{name}: nvcc failed")
            return 1
        usage = parse_ptxas(run.stdout + run.stderr)
        ptx, files = {}, {}
        for a in archs:
            path = os.path.join(keep, f"{stem}.compute_{a}.ptx")
            if len(archs) == 1 and not os.path.exists(path):
                path = os.path.join(keep, f"{stem}.ptx")  # nvcc's name with one architecture
            with open(path) as f:
                text = f.read()
            ptx[a], files[a] = ptx_functions(text), file_table(text)

        names = demangle(sorted({k for (_, k) in usage}))

        def ours(mangled):
            pretty = names.get(mangled, mangled)
            return pretty.startswith(args.namespace) or pretty.startswith("void " + args.namespace)

        usage = {key: u for key, u in usage.items() if ours(key[1])}
        allowed = load_allowed(args.allow_spills)
        stack_allowed = load_allowed(args.allow_stack)
        low_occupancy = load_allowed(args.occupancy_exceptions)
        wide = [(VECTOR_LOAD, "16-byte global load", p, r) for p, r in load_allowed(args.vector_loads)]
        wide += [(VECTOR_STORE, "16-byte global store", p, r) for p, r in load_allowed(args.vector_stores)]
        wide += [(WIDE_STORE, "global store of 8 bytes or more", p, r) for p, r in load_allowed(args.wide_stores)]
        division_limits = load_limits(args.divisions)
        launches = load_launches(args.launches) if args.launches else {}
        launched = set()
        rows = []
        for (sm, mangled), u in sorted(usage.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            arch = sm[3:]
            kind, threads, _ = ptx[arch].get(mangled, ("entry", None, ""))
            pretty = short(names.get(mangled, mangled))
            if threads is None:
                problems.append(f"{sm} {pretty}: no __launch_bounds__ (no .maxntid in the PTX)")
                threads = 1024
            if u["regs"] * threads > REGISTERS_PER_BLOCK:
                problems.append(f"{sm} {pretty}: {u['regs']} registers x {threads} threads = {u['regs'] * threads} "
                                f"> {REGISTERS_PER_BLOCK}: the launch fails with cudaErrorLaunchOutOfResources")
            if u["smem"] > STATIC_SHARED_LIMIT:
                problems.append(f"{sm} {pretty}: {u['smem']} bytes of static shared memory > {STATIC_SHARED_LIMIT}")
            if (u["spill_stores"] or u["spill_loads"]) and not excepted(allowed, mangled):
                problems.append(f"{sm} {pretty}: spills ({u['spill_stores']} bytes stored, {u['spill_loads']} "
                                f"loaded) to local memory")
            if threads > 1 and u["stack"] and not excepted(stack_allowed, mangled):
                problems.append(f"{sm} {pretty}: a {u['stack']}-byte stack frame (local memory: an array indexed at "
                                f"run time, or a struct copied whole) in a kernel of {threads} threads")
            occupancy = register_occupancy(u["regs"], threads)
            if threads >= 64 and occupancy < MIN_OCCUPANCY and not excepted(low_occupancy, mangled):
                problems.append(f"{sm} {pretty}: {u['regs']} registers at {threads} threads per block leave "
                                f"{occupancy:.0%} occupancy (< {MIN_OCCUPANCY:.0%})")
            for pattern, what, p, reason in wide:
                if matches(p, mangled) and not has_access(ptx[arch], mangled, pattern):
                    problems.append(f"{sm} {pretty}: no {what} ({reason})")
            for p, most, reason in division_limits:
                if not matches(p, mangled):
                    continue
                divisions = count_in_calls(ptx[arch], mangled, DIVISION)
                if divisions > most:
                    problems.append(f"{sm} {pretty}: {divisions} floating-point divisions in the PTX, at most {most} "
                                    f"({reason})")
            if mangled in launches:
                launched.add(mangled)
                problems += launch_problems(sm, pretty, launches[mangled], ptx[arch].get(mangled, (0, None))[1],
                                            u["smem"])
            rows.append((sm, u["regs"], threads, occupancy, u["smem"], u["stack"], u["spill_stores"], pretty))

        if args.launches:
            kernels = {mangled for (_, mangled) in usage}
            print(f"{name}: {len(launched)} of its {len(kernels)} kernels were launched by the SIMT tests "
                  f"(recorded in {os.path.basename(args.launches)}), checked against their launches")
            for mangled in sorted(kernels - launched):
                pretty = short(names.get(mangled, mangled))
                print(f"  not checked (not launched by the SIMT tests, or not named by them): {pretty}")
                if args.all_launched:
                    problems.append(f"{pretty}: no SIMT test launched it (or its name has no dynamic symbol: a "
                                    f"type in an anonymous namespace); every kernel must run under the backend")
            if not launched:
                problems.append(f"no kernel of {name} is in {args.launches}: the names differ, or nothing ran")

        if not args.no_contraction_check:
            arch = "90" if "90" in archs else archs[0]
            plain = os.path.join(keep, "nofmad.ptx")
            cmd = [args.nvcc, "-ptx", "--fmad=false", f"-arch=compute_{arch}", "-o", plain] + common + [args.source]
            run = subprocess.run(cmd, capture_output=True, text=True)
            if run.returncode != 0:
                sys.stderr.write(run.stdout + run.stderr)
                print(f"{name}: nvcc --fmad=false failed")
                return 1
            with open(plain) as f:
                text = f.read()
            unfused, unfused_files = ptx_functions(text), file_table(text)
            unfused = {stable_name(n): body for n, body in unfused.items()}
            fused = ptx[arch]
            pretty = demangle(sorted(fused))
            mine = [n for n in fused if pretty[n].startswith(args.namespace) or pretty[n].startswith("void " + args.namespace)]
            for n in sorted(n for n in mine if stable_name(n) not in unfused):
                problems.append(f"compute_{arch} {short(pretty[n])}: not in the --fmad=false PTX, so not compared")
            differ = sorted(n for n in mine if stable_name(n) in unfused and
                            normalized(fused[n][2]) != normalized(unfused[stable_name(n)][2]))
            loose = sorted(n for n in mine if fusable_pairs(fused[n][2]))
            for n in differ:
                sites = fma_sites(fused[n][2], files[arch])
                for explicit in fma_sites(unfused[stable_name(n)][2], unfused_files):
                    if explicit in sites:
                        sites.remove(explicit)
                problems.append(f"compute_{arch} {short(pretty.get(n, n))}: nvcc fuses multiply-adds the source "
                                f"leaves separate (the PTX differs under --fmad=false), at {', '.join(sorted(set(sites)))}")
            for n in loose:
                pairs = fusable_pairs(fused[n][2], files[arch])
                problems.append(f"compute_{arch} {short(pretty.get(n, n))}: {len(pairs)} multiply(ies) feed an add "
                                f"without a rounding mode, which ptxas may fuse (e.g. {pairs[0]})")

    print(f"{name}: {len(rows)} kernel compilations over sm_{', sm_'.join(archs)}")
    print(f"{'arch':7}{'regs':>5}{'threads':>8}{'occ':>5}{'smem':>7}{'stack':>6}{'spill':>6}  kernel")
    for sm, regs, threads, occupancy, smem, stack, spill, pretty in rows:
        print(f"{sm:7}{regs:>5}{threads:>8}{occupancy:>5.0%}{smem:>7}{stack:>6}{spill:>6}  {pretty}")
    if problems:
        print(f"\n{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    print("\nall kernels fit their launch, nothing spills, no stack frames in multi-thread kernels (or excepted), "
          "occupancy >= 50 % (or excepted), "
          "the listed kernels load (and store) 16 bytes and keep to their divisions, no implicit contraction" +
          (", the recorded launches keep to the bounds and the shared memory limits" if args.launches else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
