#!/usr/bin/env python3
"""Compiles every C++ snippet the documentation shows, so that a doc change that breaks one fails CI.

Snippets come from the ```cpp / ```cuda blocks of README.md and docs/*.md, and from every
@code ... @endcode example in include/gradzip. Each is one of:

  fragment   statements, as most examples are. All host fragments go into one translation unit,
             each in a function of its own, after tests/snippets/names.hpp, which declares the
             names the docs use without declaring them (n, grad, out, exec, ...). Fragments that
             mention CUDA (gradzip::cuda, d_ buffers, NCCL) go into a .cu unit compiled by nvcc
             after names.cuh; fragments that use MPI see <gradzip/comm/mpi.hpp>. Compiled, not
             run: their inputs are only declared.
  program    a block with `int main(`: compiled, linked and run (host), or compiled (CUDA).
  project    blocks marked `<!-- snippet: project=NAME file=FILE -->` in Markdown are written
             into one CMake project, which is configured with gradzip as its FetchContent
             dependency (this source tree), built with warnings as errors, and run.

A Markdown block may be preceded by one directive comment:
  <!-- snippet: toplevel -->           declarations at namespace scope, not statements
  <!-- snippet: skip REASON -->        not compiled (e.g. it needs a library CI lacks); listed
  <!-- snippet: project=NAME file=F [run=EXE [expect="TEXT"]] -->
                                       a file of a project; EXE is built and run (a CUDA
                                       one only where a GPU is), its output must hold TEXT

`#line` directives make a compiler error name the document and line of the snippet.

Usage: snippets.py --source DIR --work DIR --mode fragments|projects [--cxx g++] [--nvcc nvcc]
       [--cuda-arch 90] [--mpi-cflags "..."] [--list]
"""
import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field

CPP_LANGS = {"cpp", "c++", "cuda", "cu"}
DIRECTIVE = re.compile(r"^\s*<!--\s*snippet:\s*(.*?)\s*-->\s*$")
CUDA_WORDS = re.compile(r"gradzip::cuda\b|\bcuda_exec\b|\bd_\w+|nccl|cudaStream|\.cuh>")
MPI_WORDS = re.compile(r"\bMPI_\w+|mpi_communicator|comm/mpi\.hpp")
CUDA_FILE = re.compile(r"\.cuh?$")


@dataclass
class Snippet:
    path: str  # relative to the source tree
    line: int  # line of the first code line
    text: str
    lang: str = "cpp"
    directives: dict = field(default_factory=dict)

    @property
    def where(self):
        return f"{self.path}:{self.line}"

    def code(self):
        """The text without // comments (which may mention CUDA in a host example)."""
        return re.sub(r"//[^\n]*", "", self.text)

    def is_cuda(self):
        return self.lang in ("cuda", "cu") or bool(CUDA_WORDS.search(self.code()))

    def is_program(self):
        return "int main(" in self.text


def parse_directive(text):
    d = {}
    if text.startswith("skip"):
        d["skip"] = text[4:].strip() or "no reason given"
        return d
    for word in shlex.split(text):
        key, _, value = word.partition("=")
        d[key] = value or True
    return d


def markdown_snippets(root, rel):
    lines = open(os.path.join(root, rel), encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```\s*([\w+-]*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        lang, start, j = m.group(1).lower(), i, i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if j == len(lines):
            sys.exit(f"{rel}:{start + 1}: code block never closed")
        prev = next((lines[p] for p in range(start - 1, -1, -1) if lines[p].strip()), "")
        dm = DIRECTIVE.match(prev)
        directives = parse_directive(dm.group(1)) if dm else {}
        if lang in CPP_LANGS or "project" in directives:
            out.append(Snippet(rel, start + 2, "\n".join(lines[start + 1:j]), lang or "text", directives))
        i = j + 1
    return out


def header_snippets(root, rel):
    lines = open(os.path.join(root, rel), encoding="utf-8").read().split("\n")
    out, i = [], 0
    while i < len(lines):
        if "@code" not in lines[i]:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and "@endcode" not in lines[j]:
            j += 1
        body = [re.sub(r"^\s*\*( |$)", "", line) for line in lines[i + 1:j]]
        out.append(Snippet(rel, i + 2, "\n".join(body), "cu" if CUDA_FILE.search(rel) else "cpp"))
        i = j + 1
    return out


def collect(root):
    found = []
    docs = ["README.md"] + sorted("docs/" + f for f in os.listdir(os.path.join(root, "docs")) if f.endswith(".md"))
    for rel in docs:
        found += markdown_snippets(root, rel)
    for dirpath, _, files in sorted(os.walk(os.path.join(root, "include", "gradzip"))):
        for f in sorted(files):
            if f.endswith((".hpp", ".cuh")):
                found += header_snippets(root, os.path.relpath(os.path.join(dirpath, f), root))
    return found


def translation_unit(snippets, prelude):
    """One unit holding every fragment, each in its own namespace, with #line back to its source."""
    includes, bodies = [], []
    for k, s in enumerate(snippets):
        kept = []
        for line in s.text.split("\n"):
            if line.lstrip().startswith("#include"):
                includes.append(f'#line {s.line + len(kept)} "{s.path}"\n{line}')
                kept.append("")  # keeps the line numbers of what follows
            else:
                kept.append(line)
        body = "\n".join(kept)
        if s.directives.get("toplevel"):
            bodies.append(f'namespace snippet_{k} {{\n#line {s.line} "{s.path}"\n{body}\n}}\n')
        else:
            bodies.append(f'namespace snippet_{k} {{\n[[maybe_unused]] void run() {{\n#line {s.line} "{s.path}"\n{body}\n}}\n}}\n')
    return f'#include "{prelude}"\n' + "\n".join(includes) + "\n\n" + "\n".join(bodies)


def run(cmd, cwd=None, what=""):
    print("+ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode != 0:
        print(r.stdout)
        sys.exit(f"FAILED ({r.returncode}): {what}")
    return r.stdout


def host_flags(a):
    return ["-std=c++17", "-fopenmp", "-ffp-contract=off", "-Wall", "-Wextra", "-Werror",
            "-Wno-unused-variable", "-Wno-unused-but-set-variable", "-Wno-unused-parameter",
            "-I", os.path.join(a.source, "include"), "-I", os.path.join(a.source, "tests", "snippets")]


def fragments(a, snippets):
    os.makedirs(a.work, exist_ok=True)
    host, cuda, programs = [], [], []
    for s in snippets:
        (programs if s.is_program() else cuda if s.is_cuda() else host).append(s)
    mpi = [s for s in host if MPI_WORDS.search(s.code())]
    mpi_flags = shlex.split(a.mpi_cflags or "")
    if mpi and not a.mpi_cflags:
        for s in mpi:
            print(f"{s.where}: uses MPI, and no --mpi-cflags were given: not compiled")
        host = [s for s in host if s not in mpi]

    print(f"{len(host)} host fragments, {len(cuda)} CUDA fragments, {len(programs)} programs")
    tu = os.path.join(a.work, "host_fragments.cpp")
    open(tu, "w").write(translation_unit(host, "names.hpp"))
    run([a.cxx] + host_flags(a) + mpi_flags + ["-DGRADZIP_SNIPPETS_MPI=" + ("1" if a.mpi_cflags else "0"),
                                              "-c", tu, "-o", os.path.join(a.work, "host_fragments.o")],
        what=f"the host fragments ({tu})")

    if cuda:
        if not a.nvcc:
            sys.exit("CUDA fragments exist and no --nvcc was given")
        cu = os.path.join(a.work, "cuda_fragments.cu")
        open(cu, "w").write(translation_unit(cuda, "names.cuh"))
        run([a.nvcc, "-std=c++17", f"-arch=sm_{a.cuda_arch}", "--Werror", "all-warnings",
             "-Xcompiler=-Wall,-Werror,-Wno-unused-variable,-Wno-unused-but-set-variable",
             "-I", os.path.join(a.source, "include"), "-I", os.path.join(a.source, "tests", "snippets"),
             "-c", cu, "-o", os.path.join(a.work, "cuda_fragments.o")], what=f"the CUDA fragments ({cu})")

    for k, s in enumerate(programs):
        if s.is_cuda():
            src = os.path.join(a.work, f"program_{k}.cu")
            open(src, "w").write(f'#line {s.line} "{s.path}"\n{s.text}\n')
            run([a.nvcc, "-std=c++17", f"-arch=sm_{a.cuda_arch}", "-I", os.path.join(a.source, "include"),
                 "-c", src, "-o", src + ".o"], what=s.where)
        else:
            src = os.path.join(a.work, f"program_{k}.cpp")
            open(src, "w").write(f'#line {s.line} "{s.path}"\n{s.text}\n')
            exe = os.path.join(a.work, f"program_{k}")
            run([a.cxx] + host_flags(a) + [src, "-o", exe], what=s.where)
            print(run([exe], what=f"running {s.where}"))


def projects(a, snippets):
    by_name = {}
    for s in snippets:
        by_name.setdefault(s.directives["project"], []).append(s)
    if not by_name:
        sys.exit("no project snippets found")
    have_gpu = shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0
    for name, files in by_name.items():
        root = os.path.join(a.work, name)
        shutil.rmtree(root, ignore_errors=True)
        os.makedirs(root)
        for s in files:
            text = s.text
            if s.directives["file"] == "CMakeLists.txt":
                # The README fetches from the repository; the test fetches this source tree.
                text, count = re.subn(r"GIT_REPOSITORY\s+[^\s)]+(\s+GIT_TAG\s+[^\s)]+)?", "SOURCE_DIR ${GRADZIP_SOURCE_DIR}", text)
                if count != 1:
                    sys.exit(f"{s.where}: expected one GIT_REPOSITORY line in the project's CMakeLists.txt")
            open(os.path.join(root, s.directives["file"]), "w").write(text + "\n")
            print(f"{s.where} -> {name}/{s.directives['file']}")
        build = os.path.join(root, "build")
        cmd = [a.cmake, "-S", root, "-B", build, f"-DGRADZIP_SOURCE_DIR={a.source}",
               "-DCMAKE_CXX_FLAGS=-Wall -Wextra -Werror"]
        if a.generator:
            cmd += ["-G", a.generator]
        if a.nvcc:
            cmd += [f"-DCMAKE_CUDA_COMPILER={a.nvcc}", f"-DCMAKE_CUDA_ARCHITECTURES={a.cuda_arch}",
                    "-DCMAKE_CUDA_FLAGS=--Werror all-warnings -Xcompiler=-Wall,-Werror"]
        run(cmd, what=f"configuring project {name}")
        run([a.cmake, "--build", build], what=f"building project {name}")
        for s in files:
            exe = s.directives.get("run")
            if not exe:
                continue
            path = os.path.join(build, exe)
            is_cuda = s.directives["file"].endswith(".cu")
            if not os.path.exists(path):
                if is_cuda and not a.nvcc:
                    print(f"{s.where}: no nvcc given, so no CUDA program")
                    continue
                sys.exit(f"{s.where}: the project built no {exe}")
            if is_cuda and not have_gpu:
                print(f"{s.where}: {exe} built; not run (no GPU on this machine)")
                continue
            # Two OpenMP threads, so that `expect` can tell whether the target brought OpenMP.
            r = subprocess.run([path], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env=dict(os.environ, OMP_NUM_THREADS="2"))
            print(r.stdout, end="")
            if r.returncode != 0:
                sys.exit(f"FAILED ({r.returncode}): running {exe} from {s.where}")
            if "expect" in s.directives and s.directives["expect"] not in r.stdout:
                sys.exit(f"{s.where}: {exe} printed no {s.directives['expect']!r}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", required=True)
    p.add_argument("--work", required=True)
    p.add_argument("--mode", choices=["fragments", "projects"], required=True)
    p.add_argument("--cxx", default="g++")
    p.add_argument("--nvcc")
    p.add_argument("--cuda-arch", default="90")
    p.add_argument("--cmake", default="cmake")
    p.add_argument("--generator")
    p.add_argument("--mpi-cflags")
    p.add_argument("--list", action="store_true", help="list the snippets and how each is checked")
    a = p.parse_args()
    a.source = os.path.abspath(a.source)
    a.work = os.path.abspath(a.work)

    snippets = collect(a.source)
    skipped = [s for s in snippets if "skip" in s.directives]
    for s in skipped:
        print(f"{s.where}: not compiled: {s.directives['skip']}")
    live = [s for s in snippets if "skip" not in s.directives]
    in_projects = [s for s in live if "project" in s.directives]
    others = [s for s in live if "project" not in s.directives]
    if a.list:
        for s in others:
            kind = "program" if s.is_program() else "fragment"
            print(f"{s.where}: {'CUDA' if s.is_cuda() else 'host'} {kind}")
        for s in in_projects:
            print(f"{s.where}: project {s.directives['project']}, file {s.directives['file']}")
        return
    print(f"{len(snippets)} snippets: {len(others)} fragments and programs, {len(in_projects)} project files, "
          f"{len(skipped)} skipped")
    if a.mode == "fragments":
        fragments(a, others)
    else:
        projects(a, in_projects)
    print("all snippets compiled" + (" and ran" if a.mode == "projects" else ""))


if __name__ == "__main__":
    main()
