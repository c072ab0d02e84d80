"""Keep the blocks that one script copies from another identical to their source.

    python .ci/check_copies.py        # each copy that differs: its file, line, block and a diff; exit 1
    python .ci/check_copies.py --fix  # rewrite those copies from their sources (`make fix-copies`)
    python .ci/check_copies.py --fix pqn_atari.py  # only the copies in the scripts named

Every script stands alone, so plumbing is copied between scripts (the single-file policy of Hugging Face
transformers, whose utils/check_copies.py checks the same kind of marker). A copy is a top-level function or class
(or the `if __name__ == "__main__":` block, named __main__) whose line above (above its decorators) reads

    # Copied from ppo_atari_envpool.save_checkpoint
    # Copied from ppo_atari_envpool.minibatch_statistics with agent->q_network, Agent->QNetwork

or whose first line ends with the marker, where it fits in 127 characters:

    def all_ranks_sum(x: torch.Tensor) -> torch.Tensor:  # Copied from ppo_atari_envpool.all_ranks_sum

and it must equal the named block of that script (without the marker), after the renames (whole words, left to right).
The source is never itself a copy: change the source, then run `make fix-copies`.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import re
import sys
from pathlib import Path

MARKER = re.compile(r"# Copied from (\w+)\.(\w+)(?: with (.+))?")
TRAILING_MARKER = re.compile(r"(?<=\S)  # Copied from \w+\.\w+(?: with .+)?$")


def top_level_blocks(lines: list[str], filename: str) -> dict[str, tuple[int, int]]:
    """Each top-level function or class, and the `if __name__ == "__main__":` block as __main__: name -> (index of its
    first line, decorators included; index after its last)."""
    blocks = {}
    for node in ast.parse("".join(lines), filename).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            blocks[node.name] = (min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1, node.end_lineno)
        elif isinstance(node, ast.If) and ast.unparse(node.test) == "__name__ == '__main__'":
            blocks["__main__"] = (node.lineno - 1, node.end_lineno)
    return blocks


def is_copy(lines: list[str], start: int) -> bool:
    """Whether the block that starts at line index `start` carries a marker (on its first line or the line above)."""
    return bool(TRAILING_MARKER.search(lines[start]) or start and MARKER.fullmatch(lines[start - 1].strip()))


def renamed(lines: list[str], renames: str | None) -> list[str]:
    """The lines with each `old->new` of a marker's `with` part applied to whole words."""
    pairs = [pair.split("->") for pair in renames.split(",")] if renames else []
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"renames {renames!r} are not written as old->new, old->new")
    text = "".join(lines)
    for old, new in pairs:
        text = re.sub(rf"\b{re.escape(old.strip())}\b", new.strip(), text)
    return text.splitlines(keepends=True)


def check(root: Path, fix: bool, only: list[str] | None = None) -> int:
    """Check (or fix) every copy in the scripts at the top of `root` (or in those named in `only`); print a line per
    problem; the number of problems."""
    sources = {path.stem: path.read_text().splitlines(keepends=True) for path in sorted(root.glob("*.py"))}
    try:
        blocks = {name: top_level_blocks(lines, f"{name}.py") for name, lines in sources.items()}
    except SyntaxError as error:
        print(f"{error.filename}:{error.lineno}: cannot parse it ({error.msg}): no copy was checked")
        return 1
    problems, copies = 0, 0
    for script, lines in sources.items():
        if only and f"{script}.py" not in only:
            continue
        starts = {start: name for name, (start, _) in blocks[script].items()}
        replacements = []  # (start, end, expected lines) of the copies that differ
        for index, line in enumerate(lines):
            if not (marker := MARKER.search(line)):
                continue
            copies += 1
            source, name, renames = marker.groups()
            where, trailing = f"{script}.py:{index + 1}", not line.lstrip().startswith("#")
            first = index if trailing else index + 1  # the block's first line
            if first not in starts or (trailing and not TRAILING_MARKER.search(line)):
                print(f"{where}: '{marker[0]}' is not on or right above the first line of a top-level function or class")
            elif name not in blocks.get(source, {}):
                print(f"{where}: {source}.py has no top-level function or class named {name}")
            elif is_copy(sources[source], blocks[source][name][0]):
                print(f"{where}: {source}.{name} is itself a copy; name the block it was copied from")
            else:
                start, end = blocks[script][starts[first]]
                source_start, source_end = blocks[source][name]
                expected = renamed(sources[source][source_start:source_end], renames)
                if trailing:  # the marker stays where it is
                    expected[0] = expected[0].rstrip("\n") + TRAILING_MARKER.search(line)[0] + "\n"
                if lines[start:end] == expected:
                    continue
                if fix:
                    replacements.append((start, end, expected))
                    print(f"{where}: rewrote {starts[first]} from {source}.{name}")
                    continue
                diff = difflib.unified_diff(expected, lines[start:end], f"{source}.py ({name})", f"{script}.py", n=1)
                print(f"{where}: {starts[first]} differs from {source}.{name}:\n{''.join(diff)}")
                print(f"{where}: change {source}.py, then `make fix-copies`; a block that must differ: delete its marker")
            problems += 1
        for start, end, expected in sorted(replacements, reverse=True):  # from the bottom: earlier indices stay valid
            lines[start:end] = expected
        if replacements:
            (root / f"{script}.py").write_text("".join(lines))
            # its blocks moved: a script copying from it reads the new lines
            blocks[script] = top_level_blocks(lines, f"{script}.py")
    if not problems:
        print(f"{copies} copies checked: each is identical to its source" if not fix else f"{copies} copies up to date")
    return problems


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fix", action="store_true", help="rewrite the copies that differ from their source")
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent, help="the repository")
    parser.add_argument("scripts", nargs="*", help="only the copies in these scripts (file names; default: all)")
    options = parser.parse_args()
    if unknown := [
        name for name in options.scripts if not (name.endswith(".py") and (options.root / Path(name).name).is_file())
    ]:
        parser.error(f"no such script in {options.root}: {', '.join(unknown)}")
    sys.exit(1 if check(options.root, options.fix, [Path(name).name for name in options.scripts]) else 0)
