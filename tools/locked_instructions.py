#!/usr/bin/env python3
"""Locked instructions (atomic read-modify-writes) executed per iteration, per function.

A locked instruction (a `lock`-prefixed op, or `xchg` with memory) costs about 30 cycles on the
2-core CI VM whatever its instruction count says: a mutex round trip is two, an `Arc` clone and
drop two, a relaxed `fetch_add` one. Callgrind counts them as one instruction each; this joins
callgrind's per-instruction counts with objdump's disassembly to count them.

    valgrind --tool=callgrind --dump-instr=yes --trace-children=yes --separate-threads=yes \\
        --callgrind-out-file=/tmp/cg/s%p target/release/nrt bench --model identity \\
        --iterations 4000 --warmup 10
    tools/locked_instructions.py /tmp/cg/s<pid>-<thread> 4010

Prints the total per iteration (divide by the executions the thread ran: iterations plus
warm-up), then the instructions at or above 0.5 per iteration with their function; with
`--where` after the arguments, each with its source lines, innermost inlined frame first
(`addr2line -i`; needs the binary's debug line tables).
"""
import collections
import re
import subprocess
import sys

LOCKED = re.compile(r"\s+([0-9a-f]+):\s+((?:lock\s.*)|(?:xchg\s+%\w+,.*\(.*\)))$")


def locked_addresses(path):
    """Address -> instruction text of every locked instruction in the object at `path`."""
    out = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", path], capture_output=True, text=True
    ).stdout
    found = {}
    for line in out.splitlines():
        m = LOCKED.match(line)
        if m:
            found[int(m.group(1), 16)] = m.group(2).strip()
    return found


def instruction_counts(path):
    """(object, address) -> (Ir, function) for every instruction of a callgrind file."""
    names = {"ob": {}, "fn": {}}
    ob = fn = None
    counts = collections.Counter()
    owner = {}
    skip_next = False
    last = 0
    address = re.compile(r"^(0x[0-9a-f]+|[+-]\d+|\*)(?:\s+\S+\s+(\d+))?")
    for line in open(path):
        kind = line[:4]
        if kind in ("cob=", "cfn=", "cfi=") or line.startswith(("ob=", "fn=")):
            m = re.match(r"c?(ob|fn|fi|fl)=\((\d+)\)(?: (.*))?", line.strip())
            if m and m.group(1) in names and m.group(3):
                names[m.group(1)][m.group(2)] = m.group(3)
            if m and not line.startswith("c"):
                if m.group(1) == "ob":
                    ob = names["ob"].get(m.group(2))
                elif m.group(1) == "fn":
                    fn = names["fn"].get(m.group(2))
            continue
        if line.startswith("calls="):
            skip_next = True
            continue
        m = address.match(line)
        if not m:
            continue
        a = m.group(1)
        if a.startswith("0x"):
            last = int(a, 16)
        elif a != "*":
            last += int(a)
        if m.group(2) is None:
            continue
        if skip_next:  # the inclusive cost of a call, not this instruction's own
            skip_next = False
            continue
        counts[(ob, last)] += int(m.group(2))
        owner[(ob, last)] = fn
    return counts, owner


def source_lines(obj, address):
    """The source lines of the instruction at `address` in `obj`, innermost inlined first."""
    out = subprocess.run(
        ["addr2line", "-i", "-e", obj, hex(address)], capture_output=True, text=True
    ).stdout
    return [line.split("/")[-1] if "/rustc/" not in line else "std " + line.split("/")[-1]
            for line in out.splitlines()]


def main():
    args = [a for a in sys.argv[1:] if a != "--where"]
    where = len(args) != len(sys.argv) - 1
    if len(args) != 2:
        sys.exit(__doc__)
    counts, owner = instruction_counts(args[0])
    iterations = float(args[1])
    total = 0
    per = collections.Counter()
    for obj in {o for o, _ in counts if o}:
        try:
            locked = locked_addresses(obj)
        except OSError:
            continue
        for (o, a), c in counts.items():
            if o == obj and a in locked:
                total += c
                per[(owner[(o, a)], locked[a], o, a)] += c
    print(f"locked instructions per iteration: {total / iterations:.1f}")
    for (fn, text, obj, a), c in per.most_common():
        if c / iterations >= 0.5:
            print(f"{c / iterations:8.1f}  {text[:40]:40}  {fn}")
            if where:
                for frame in source_lines(obj, a):
                    print(f"{'':50}{frame}")


if __name__ == "__main__":
    main()
