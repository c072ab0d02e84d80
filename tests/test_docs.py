"""The Markdown documentation: every relative link resolves, and the two long files stay within their sizes.

A link resolves when the file it names exists (relative to the file that links, as GitHub reads it) and, with a
`#anchor`, when the anchor is the slug of a heading of the target file under GitHub's rules: the heading's text
lowercased, every character but letters, digits, spaces, '-' and '_' removed, spaces turned into '-', and the second
heading of the same slug given '-1', the third '-2'. Links inside code (fenced blocks, `inline code`) are not links.
Pure file reading: no subprocess, a fraction of a second.
"""

import glob
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MARKDOWN_FOLDERS = ["docs", "benchmarks", "tests", "sweeps"]  # and the top level
LINE_LIMITS = {"README.md": 450, "benchmarks/RESULTS.md": 600}

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)(?:\s+#+)?\s*$")


def markdown_files():
    """Every Markdown file of the documentation that exists now, as paths relative to the repository's root."""
    paths = glob.glob(os.path.join(ROOT, "*.md"))
    for folder in MARKDOWN_FOLDERS:
        paths += glob.glob(os.path.join(ROOT, folder, "**", "*.md"), recursive=True)
    return sorted(os.path.relpath(path, ROOT) for path in paths)


def prose_lines(text):
    """The lines of a Markdown text outside fenced code blocks (those inside come back empty, so numbering holds)."""
    lines, fence = [], None
    for line in text.split("\n"):
        match = FENCE.match(line)
        if fence is None and match:
            fence = match.group(1)[0] * len(match.group(1))
            lines.append("")
        elif fence is not None:
            if line.strip().startswith(fence) and set(line.strip()) <= {fence[0]}:
                fence = None
            lines.append("")
        else:
            lines.append(line)
    return lines


def slug(heading_text):
    """GitHub's anchor for a heading: rendered text (no backticks, emphasis stars or link targets), lowercased,
    punctuation but '-' and '_' removed, spaces to '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading_text)  # a link shows its text
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # \w: letters, digits and '_' (Unicode letters too, as GitHub keeps them)
    return text.replace(" ", "-")


def anchors(text):
    """The anchors of a Markdown text's headings, duplicates numbered as GitHub numbers them."""
    seen, found = {}, set()
    for line in prose_lines(text):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(2))
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(text):
    """The link and image targets of a Markdown text outside code, with the line each starts on."""
    prose = "\n".join(prose_lines(text))
    prose = INLINE_CODE.sub(lambda code: re.sub(r"[^\n]", "x", code.group(0)), prose)  # same length, same lines
    return [(prose.count("\n", 0, match.start()) + 1, match.group(1)) for match in LINK.finditer(prose)]


def is_relative(target):
    return not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) and not target.startswith("//")


def broken_links(path):
    """'file:line: target (why)' for each relative link of the file at `path` (relative to ROOT) that does not resolve."""
    text = open(os.path.join(ROOT, path), encoding="utf-8").read()
    problems = []
    for line, target in links(text):
        if not is_relative(target):
            continue
        file_part, _, anchor = target.partition("#")
        target_path = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) if file_part else path
        full = os.path.join(ROOT, target_path)
        if not os.path.exists(full):
            problems.append(f"{path}:{line}: {target} (no file {target_path})")
        elif anchor and target_path.endswith(".md"):
            if anchor not in anchors(open(full, encoding="utf-8").read()):
                problems.append(f"{path}:{line}: {target} (no heading of {target_path} has the anchor #{anchor})")
    return problems


def test_slug_follows_githubs_rules():
    assert slug("## not a level: the text only") == "-not-a-level-the-text-only"  # '#' is punctuation too
    assert slug("`ppo_atari_envpool.py`: PPO on Atari") == "ppo_atari_envpoolpy-ppo-on-atari"
    assert slug("Schedules and `--target-ddr`") == "schedules-and---target-ddr"
    assert slug("PPO+RND on Breakout: a check of the script, not of exploration") == (
        "ppornd-on-breakout-a-check-of-the-script-not-of-exploration"
    )
    assert slug("The metrics' cost and the NaN check") == "the-metrics-cost-and-the-nan-check"
    assert slug("N_envs schedule, **bold** and [a link](x.md)") == "n_envs-schedule-bold-and-a-link"


def test_anchors_number_duplicates_and_skip_code():
    text = "# Title\n## Usage\ntext\n```bash\n# a comment, not a heading\n```\n## Usage\n## Usage\n    ## indented: code\n"
    assert anchors(text) == {"title", "usage", "usage-1", "usage-2"}


def test_links_outside_code_only():
    text = (
        "See [the page](docs/a.md#part) and ![a plot](b.png).\n"
        "`[not a link](x.md)` and\n```\n[nor this](y.md)\n```\n"
        '[a link whose text\nspans `two\nlines`](z.md "title") [web](https://example.com)\n'
    )
    assert links(text) == [(1, "docs/a.md#part"), (1, "b.png"), (6, "z.md"), (8, "https://example.com")]


def test_broken_links_are_found(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "ROOT", str(tmp_path))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n## Part one\n[up](../README.md#intro) [self](#part-one)\n")
    (tmp_path / "README.md").write_text(
        "# Intro\n[ok](docs/page.md#part-one) [no anchor](docs/page.md#part-two) [no file](docs/gone.md)\n"
    )
    assert broken_links("docs/page.md") == []
    assert broken_links("README.md") == [
        "README.md:2: docs/page.md#part-two (no heading of docs/page.md has the anchor #part-two)",
        "README.md:2: docs/gone.md (no file docs/gone.md)",
    ]


@pytest.mark.parametrize("path", markdown_files())
def test_every_relative_link_resolves(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path, limit", LINE_LIMITS.items())
def test_long_files_stay_within_their_size(path, limit):
    lines = open(os.path.join(ROOT, path), encoding="utf-8").read().count("\n")
    assert lines <= limit, f"{path} has {lines} lines, over its {limit}"
