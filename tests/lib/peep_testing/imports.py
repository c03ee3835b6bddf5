"""What the import-structure tests share: the groups of modules (or folders) that import each other in a loop."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping


def strongly_connected_groups(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one node (Tarjan), each sorted, the list sorted.

    Parameters
    ----------
    graph : mapping of node -> the nodes it imports
        A node imported but not a key has no imports of its own.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))  # a few hundred modules deep at most
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)
