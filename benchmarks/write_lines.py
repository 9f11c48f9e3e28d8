"""The child of the throughput benchmark: `python write_lines.py {buffered|print} BYTES`.

Writes BYTES (a multiple of 1,000,000) of 100-byte lines to stdout, the same bytes on every
run, so the log muster keeps can be compared with a plain redirect by size and sha256.

- buffered: 1 MB writes of 10,000 lines, each block starting with its number.
- print: one `print()` per numbered line; run it with PYTHONUNBUFFERED=1 (as muster does)
  and every line is its own write.
"""

from __future__ import annotations

import sys

LINE_BYTES = 100
BLOCK_BYTES = 1_000_000


def write_buffered(total: int) -> None:
    body = b"".join(b"%05d %s\n" % (n, b"x" * 93) for n in range(1, BLOCK_BYTES // LINE_BYTES))
    out = sys.stdout.buffer
    for block in range(total // BLOCK_BYTES):
        out.write(b"block %08d %s\n" % (block, b"-" * 84) + body)
    out.flush()


def write_printed(total: int) -> None:
    filler = "y" * 89
    for n in range(total // LINE_BYTES):
        print(f"{n:010d} {filler}")


if __name__ == "__main__":
    mode, size = sys.argv[1], int(sys.argv[2])
    if size % BLOCK_BYTES:
        raise SystemExit(f"BYTES must be a multiple of {BLOCK_BYTES}, but got {size}.")
    {"buffered": write_buffered, "print": write_printed}[mode](size)
