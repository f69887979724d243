"""Summarize a py-spy profile in collapsed-stack form (`py-spy record --format raw`).

Run: `python -m bench.profile_summary FILE [--top 25] [--under anyrtd/] [--within FUNCTION]`.
Prints, for each function (file:function), its share of the samples with it anywhere on the
stack (inclusive) and as the innermost frame (self), largest first; with `--within`, of the
samples inside that function only.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")


def frame_name(frame: str) -> str:
    """Return `file:function` of one py-spy frame, the file shortened to its package path."""
    match = FRAME.match(frame.strip())
    if match is None:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "lib/python3.11/", "/work/wt/"):
        if marker in path:
            path = path.split(marker, 1)[1]
    path = re.sub(r"^[^/]+/(anyrtd|bench)/", r"\1/", path)
    return f"{path}:{match['fn']}"


def summarize(lines: Iterable[str], within: str = "") -> tuple[int, Counter[str], Counter[str]]:
    """Return the sample count, and the inclusive and self samples of each function; only
    of the samples with a function named `within` (its `file:function` ends so) on the stack,
    when given, and of the frames from its outermost call inward."""
    total = 0
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [frame_name(f) for f in stack.split(";") if f]
        if within:
            inside = [i for i, name in enumerate(frames) if name.endswith(within)]
            if not inside:
                continue
            frames = frames[inside[0] :]
        total += n
        for name in set(frames):
            inclusive[name] += n
        if frames:
            own[frames[-1]] += n
    return total, inclusive, own


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--under", default="", help="only functions whose file starts so")
    parser.add_argument(
        "--within",
        default="",
        help="only the samples inside this function (`file:function` ends so, e.g. "
        "`Firing.start_batch`), as shares of them",
    )
    args = parser.parse_args()
    total, inclusive, own = summarize(args.profile.read_text().splitlines(), args.within)
    print(f"{total} samples")
    for title, table in (("inclusive", inclusive), ("self", own)):
        print(f"\n{title}:")
        rows = [(k, v) for k, v in table.most_common() if k.startswith(args.under)]
        for name, n in rows[: args.top]:
            print(f"{100 * n / total:6.1f} %  {name}")


if __name__ == "__main__":
    main()
