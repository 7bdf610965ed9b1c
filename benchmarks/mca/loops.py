"""Print (or write) the vector loop bodies of one function in GCC's aarch64 assembly:
every block from a label to a conditional branch back to it with q/v registers in it.
Usage: loops.py FILE.s FUNCTION [OUTPREFIX] -> one OUTPREFIX.N.s per loop, in order."""
import re
import sys

lines = open(sys.argv[1]).read().split("\n")
start = lines.index(sys.argv[2] + ":")
body = lines[start:next(k for k in range(start, len(lines)) if lines[k].strip().startswith(".size"))]
labels = {}
n = 0
for k, line in enumerate(body):
    if re.match(r"^\.L\w+:$", line):
        labels[line[:-1]] = k
    m = re.match(r"\s+(b\.\w+|bne|beq|bcc|bcs|bhi|bls|cbnz|cbz)\s+(.*)", line)
    if m and m.group(2).split(",")[-1].strip() in labels:
        blk = [x for x in body[labels[m.group(2).split(",")[-1].strip()] + 1:k + 1]
               if x.startswith("\t") and not x.strip().startswith(".")]
        if any(re.search(r"\bv\d+\.|\bq\d+\b", x) for x in blk):
            vec = sum(1 for x in blk if re.search(r"\bv\d+\.", x))
            print(f"loop {n}: {len(blk)} instructions, {vec} on vector registers")
            if len(sys.argv) > 3:
                open(f"{sys.argv[3]}.{n}.s", "w").write("\n".join(blk) + "\n")
            n += 1
