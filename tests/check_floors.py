#!/usr/bin/env python3
"""tests/check_floors.py: no #include climbs a floor.

The code is a house of floors: a folder may include its own files and those of folders on LOWER
floors, never a folder on its own floor or above. So there is no loop between folders, and each
floor can be read, built and tested with only what is below it.

  floor  folders
  0      src/core                          errors, RAII, memory kinds, the collectives' words
  1      src/config  kernels/math          the run config; per-element math
  2      kernels                           the backend interface
  3      kernels/host  kernels/cuda  kernels/kokkos   the backends
  4      src/parallel  src/data  src/storage  groups and collectives; token files; files below checkpoints
  5      src/model  src/optim  src/bench   the GPT over the backend; AdamW and schedules; measurements
  6      src/zero                          the ZeRO engine
  7      src/ckpt                          checkpoints of the engine's state
  8      src/train                         the run: trainer, step runner, records, checkpoint policy
  9      src/plan                          the planner: it sizes and prices what a run builds
  10     src/app                           the command line: main and one file per subcommand

Inside a folder the same holds file by file: a file and its header are one unit (plan.cpp with
plan.h), and no unit includes a unit of its folder that includes it back, however far round.

  python3 tests/check_floors.py [SOURCE_DIR]     exit 1 and one line per climbing include or loop
  python3 tests/check_floors.py --graph          the folder-level include graph, edge counts
"""
import pathlib
import re
import sys
from collections import Counter

FLOORS = {
    "src/core": 0,
    "src/config": 1, "kernels/math": 1,
    "kernels": 2,
    "kernels/host": 3, "kernels/cuda": 3, "kernels/kokkos": 3,
    "src/parallel": 4, "src/data": 4, "src/storage": 4,
    "src/model": 5, "src/optim": 5, "src/bench": 5,
    "src/zero": 6,
    "src/ckpt": 7,
    "src/train": 8,
    "src/plan": 9,
    "src/app": 10,
}
# Loops inside a folder that are one concept in two files, each with the reason it is not split.
KNOWN_LOOPS = {
    ("kernels/host", frozenset({"cpu_kernels", "gemm"})):
        "picking the ISA level (cpu_kernels) re-picks the GEMM libraries' kernels for it, and the GEMMs "
        "read the level and its threads",
}
SUFFIXES = {".h", ".cpp", ".cu", ".cuh"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def folder_of_include(root, inc):
    """The folder an include names: 'core/x.h' is src/core, 'kernels/host/y.h' is kernels/host."""
    for base in ("", "src/"):
        p = root / base / inc
        if p.exists():
            return str(p.parent.relative_to(root))
    return None


def loops_in_folders(units):
    """Include loops among the units of one folder: units maps (folder, stem) to the stems of its
    folder that the unit's files include. One line per loop found, as 'a -> b -> a'."""
    out, done = [], set()
    for start in sorted(units):
        # Depth-first from each unit; a path that comes back to a unit on it is a loop.
        stack = [(start, [start[1]])]
        while stack:
            (folder, stem), path = stack.pop()
            for nxt in sorted(units.get((folder, stem), ())):
                if nxt == path[0]:
                    loop = frozenset(path)
                    if loop not in done and (folder, loop) not in KNOWN_LOOPS:
                        done.add(loop)
                        out.append(f"{folder}: include loop {' -> '.join(path + [nxt])}: "
                                   "split a file so that one side includes the other only")
                elif nxt not in path and len(path) < 12:
                    stack.append(((folder, nxt), path + [nxt]))
    return out


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = pathlib.Path(args[0] if args else pathlib.Path(__file__).resolve().parent.parent)
    graph = "--graph" in sys.argv
    bad, unknown, edges = [], [], Counter()
    units = {}  # (folder, stem) -> stems of the same folder its files include
    for top in ("src", "kernels"):
        for f in sorted((root / top).rglob("*")):
            if f.suffix not in SUFFIXES:
                continue
            here = str(f.parent.relative_to(root))
            if here not in FLOORS:
                unknown.append(f"{f.relative_to(root)}: folder {here} has no floor in tests/check_floors.py")
                continue
            for n, line in enumerate(f.read_text(errors="replace").splitlines(), 1):
                m = INCLUDE.match(line)
                if not m:
                    continue
                there = folder_of_include(root, m.group(1))
                if there == here:
                    stem = pathlib.Path(m.group(1)).stem
                    if stem != f.stem:
                        units.setdefault((here, f.stem), set()).add(stem)
                    continue
                if there is None:
                    continue  # a system header in quotes
                edges[(here, there)] += 1
                if there not in FLOORS:
                    unknown.append(f"{f.relative_to(root)}:{n}: includes {m.group(1)} from {there}, which has no floor")
                elif FLOORS[there] >= FLOORS[here]:
                    bad.append(f"{f.relative_to(root)}:{n}: {here} (floor {FLOORS[here]}) includes {m.group(1)} "
                               f"from {there} (floor {FLOORS[there]}): a folder includes only lower floors")
    if graph:
        for (a, b), k in sorted(edges.items(), key=lambda e: (FLOORS.get(e[0][0], 99), e[0])):
            print(f"{a:14} -> {b:14} {k:3}")
    loops = loops_in_folders(units)
    for line in unknown + bad + loops:
        print(line)
    if not graph:
        print(f"check_floors: {sum(edges.values())} includes across folders, {len(bad)} climb, "
              f"{len(unknown)} in folders without a floor, {len(loops)} include loops inside a folder")
    return 1 if bad or unknown or loops else 0


if __name__ == "__main__":
    sys.exit(main())
