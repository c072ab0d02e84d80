"""The copy checker (.ci/check_copies.py, run by `make lint`): main passes; a changed line in a copy fails, naming the
file, the block and the line, with a diff; --fix restores the copy."""

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKER = ROOT / ".ci" / "check_copies.py"


def run_checker(root: Path, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, CHECKER, "--root", root, *flags], capture_output=True, text=True)


def test_every_copy_on_main_is_identical_to_its_source():
    result = run_checker(ROOT)
    assert result.returncode == 0, result.stdout
    copies = int(result.stdout.split()[0])
    assert copies == sum(path.read_text().count("# Copied from ") for path in ROOT.glob("*.py"))
    assert copies >= 30  # the plumbing of six scripts


def test_a_changed_line_in_a_copy_of_pqn_fails_with_a_diff_and_fix_restores_it(tmp_path):
    for path in ROOT.glob("*.py"):
        shutil.copy(path, tmp_path)
    original = (tmp_path / "pqn_atari.py").read_text()
    lines = original.splitlines(keepends=True)
    marker = next(i for i, line in enumerate(lines) if line.startswith("# Copied from "))
    block = re.match(r"(?:@.*\n)*(?:def|class) (\w+)", "".join(lines[marker + 1 :]))[1]
    body = next(i for i in range(marker + 2, len(lines)) if lines[i].startswith("    ") and lines[i].strip())
    lines[body] = lines[body].rstrip("\n") + "  # a local edit\n"
    (tmp_path / "pqn_atari.py").write_text("".join(lines))

    result = run_checker(tmp_path)
    assert result.returncode == 1
    assert f"pqn_atari.py:{marker + 1}: {block} differs from" in result.stdout
    assert "+" + lines[body] in result.stdout and "-" + original.splitlines(keepends=True)[body] in result.stdout
    assert "then `make fix-copies`; a block that must differ: delete its marker" in result.stdout  # --fix would undo it

    fixed = run_checker(tmp_path, "--fix")
    assert fixed.returncode == 0 and f"rewrote {block}" in fixed.stdout
    assert (tmp_path / "pqn_atari.py").read_text() == original
    assert run_checker(tmp_path).returncode == 0
    # the last line of the longest copied block too: every line is compared, not its start
    copies = [node for node in ast.parse(original).body if "# Copied from" in lines[node.lineno - 2]]
    longest = max(copies, key=lambda node: node.end_lineno - node.lineno)
    lines = original.splitlines(keepends=True)
    lines[longest.end_lineno - 1] = lines[longest.end_lineno - 1].rstrip("\n") + "  # a local edit\n"
    (tmp_path / "pqn_atari.py").write_text("".join(lines))
    assert f": {longest.name} differs from" in run_checker(tmp_path).stdout


def test_markers_that_name_nothing_or_a_copy_fail(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    return 1\n\n\n# Copied from a.f\ndef g():\n    return 1\n")
    (tmp_path / "b.py").write_text(
        "# Copied from a.missing\ndef h():\n    pass\n\n\n# Copied from a.g\ndef f():\n    return 1\n"
    )
    result = run_checker(tmp_path)
    assert result.returncode == 1
    assert "b.py:1: a.py has no top-level function or class named missing" in result.stdout
    assert "b.py:6: a.g is itself a copy" in result.stdout
    (tmp_path / "a.py").write_text("def f():\n    return 1\n\n\ndef g():  # Copied from a.f\n    return 1\n")
    assert "b.py:6: a.g is itself a copy" in run_checker(tmp_path).stdout


def test_a_marker_at_the_end_of_the_first_line_checks_and_fixes_the_same(tmp_path):
    (tmp_path / "a.py").write_text("@staticmethod\ndef f(x):\n    return x + 1\n")
    copy = "@staticmethod  # Copied from a.f\ndef f(x):\n    return x + 1\n"
    (tmp_path / "b.py").write_text(copy.replace("x + 1", "x + 2"))
    result = run_checker(tmp_path)
    assert result.returncode == 1 and "b.py:1: f differs from a.f" in result.stdout and "+    return x + 2" in result.stdout
    assert run_checker(tmp_path, "--fix").returncode == 0 and (tmp_path / "b.py").read_text() == copy
    (tmp_path / "b.py").write_text("def g():\n    pass  # Copied from a.f\n")  # not the block's first line
    assert "b.py:2: '# Copied from a.f' is not on or right above the first line" in run_checker(tmp_path).stdout


def test_a_script_that_does_not_parse_or_a_misspelt_name_is_named_in_one_line(tmp_path):
    (tmp_path / "a.py").write_text("def f():\n    return 1\n")
    (tmp_path / "scratch.py").write_text("def f(:\n")
    result = run_checker(tmp_path)
    assert result.returncode == 1 and result.stdout == "scratch.py:1: cannot parse it (invalid syntax): no copy was checked\n"
    (tmp_path / "scratch.py").unlink()
    misspelt = run_checker(tmp_path, "--fix", "aa.py")  # it would fix nothing and say all is well
    assert misspelt.returncode == 2 and misspelt.stderr.splitlines()[-1].endswith(f"no such script in {tmp_path}: aa.py")


def test_renames_apply_to_whole_words(tmp_path):
    (tmp_path / "a.py").write_text("def save(agent, agents):\n    return agent, agents\n")
    (tmp_path / "b.py").write_text(
        "# Copied from a.save with agent->q_network\ndef save(q_network, agents):\n    return q_network, agents\n"
    )
    assert run_checker(tmp_path).returncode == 0


def test_the_sweeps_game_lists_are_those_of_metrics():
    """sweeps/games.sh (the sweeps' lists) and metrics.py (the score tables' lists) name the same games in order."""
    import metrics

    script = "source sweeps/games.sh && echo $ATARI_10 && echo $HARD_EXPLORATION"
    lines = subprocess.run(["bash", "-c", script], cwd=ROOT, capture_output=True, text=True, check=True).stdout.splitlines()
    assert [line.split() for line in lines] == [metrics.ATARI_10, metrics.HARD_EXPLORATION]


def test_the_main_blocks_of_the_scripts_are_copies_too(tmp_path):
    """`if __name__ == "__main__":` is plumbing as well (a full disk, another torchrun process's end): checked as the
    block __main__."""
    for path in ROOT.glob("*.py"):
        shutil.copy(path, tmp_path)
    original = (tmp_path / "pqn_atari.py").read_text()
    assert 'if __name__ == "__main__":  # Copied from ppo_atari_envpool.__main__\n' in original
    (tmp_path / "pqn_atari.py").write_text(original.replace("        os._exit(1)", "        sys.exit(1)"))
    result = run_checker(tmp_path)
    assert result.returncode == 1 and "__main__ differs from ppo_atari_envpool.__main__" in result.stdout, result.stdout
    assert run_checker(tmp_path, "--fix").returncode == 0 and (tmp_path / "pqn_atari.py").read_text() == original
