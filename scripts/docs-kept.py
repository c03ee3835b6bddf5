"""Nothing is lost when the README is cut down: every number, code span and code-block line of an
earlier README still appears in README.md or a page of docs/.

    .venv/bin/python scripts/docs-kept.py [--rev REV] [--allow TEXT ...]

REV is the git revision whose README.md is the reference (default HEAD). Numbers are compared as
tokens (0.72 is not found inside 0.721); code spans and code-block lines as text with runs of
whitespace made one space. Prints what is missing, with its line in the old README, and exits 1
when anything is; --allow names items dropped on purpose.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

NUMBER = re.compile(r"(?<![\w.,])\d+(?:,\d{3})*(?:\.\d+)?(?![\w])")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```")


def _squash(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def items(text: str) -> list[tuple[int, str, str]]:
    """(line number, kind, item) for every number, code span and code-block line of a Markdown text."""
    found: list[tuple[int, str, str]] = []
    in_block = False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            in_block = not in_block
            continue
        if in_block:
            if line.strip():
                found.append((n, "code line", _squash(line)))
            found.extend((n, "number", m.group()) for m in NUMBER.finditer(line))
            continue
        found.extend((n, "code span", _squash(m.group(1))) for m in CODE_SPAN.finditer(line))
        found.extend((n, "number", m.group()) for m in NUMBER.finditer(line))
    return found


def missing(old: str, new_texts: list[str], allow: set[str]) -> list[tuple[int, str, str]]:
    corpus = "\n".join(new_texts)
    numbers = set(NUMBER.findall(corpus))
    squashed = _squash(corpus)
    gone = []
    for n, kind, item in items(old):
        if item in allow:
            continue
        present = item in numbers if kind == "number" else item in squashed
        if not present:
            gone.append((n, kind, item))
    return gone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rev", default="HEAD", help="git revision of the reference README.md (default HEAD)")
    p.add_argument("--allow", action="append", default=[], help="an item dropped on purpose (repeatable)")
    args = p.parse_args(argv)
    old = subprocess.run(
        ["git", "show", f"{args.rev}:README.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    gone = missing(old, [p.read_text() for p in pages], set(args.allow))
    for n, kind, item in gone:
        print(f"README.md@{args.rev}:{n}: {kind} not found in README.md or docs/*.md: {item}")
    if gone:
        print(f"{len(gone)} item(s) missing", file=sys.stderr)
        return 1
    print(f"every number, code span and code-block line of README.md@{args.rev} is in README.md or docs/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
