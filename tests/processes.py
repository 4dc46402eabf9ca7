"""Process trees from /proc, for the tests that signal a launcher and check what is left of its run."""

from __future__ import annotations

from pathlib import Path


def process_tree(root: int) -> list[int]:
    """`root` and all its descendants, from /proc."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
    tree, changed = {root}, True
    while changed:
        found = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= found
        changed = bool(found)
    return sorted(tree)


def gone(pid: int) -> bool:
    """The process has ended (a zombie waiting for its parent counts as ended)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
