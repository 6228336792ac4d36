"""``DraftTree``: a token tree in flat arrays.

Node ``i`` has ``tokens[i]`` and ``parents[i]`` (``-1`` = child of the root, i.e. of the last
committed token; else an earlier node). Optional per-node data: ``probs`` (draft probability
of the node's token), ``dists`` (the full draft distribution the token was sampled from, for
lossless speculative sampling) and ``sources`` (which drafter proposed it, for statistics and
for hybrid trees). A chain is a tree whose every parent is the previous node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    probs: list[float] | None = None
    dists: list[np.ndarray | None] | None = None
    sources: list[str] | None = None

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def chain(
        cls,
        tokens: Sequence[int],
        probs: Sequence[float] | None = None,
        dists: Sequence[np.ndarray | None] | None = None,
        source: str = "",
    ) -> DraftTree:
        n = len(tokens)
        return cls(
            tokens=[int(t) for t in tokens],
            parents=list(range(-1, n - 1)),
            probs=None if probs is None else [float(p) for p in probs],
            dists=None if dists is None else list(dists),
            sources=[source] * n if source else None,
        )

    def add(
        self,
        token: int,
        parent: int,
        prob: float | None = None,
        dist: np.ndarray | None = None,
        source: str = "",
    ) -> int:
        """Append a node and return its index (no duplicate check; see ``find_child``)."""
        if not -1 <= parent < len(self.tokens):
            raise ValueError(f"parent {parent} out of range for a tree of {len(self.tokens)} nodes")
        n = len(self.tokens)
        self.tokens.append(int(token))
        self.parents.append(int(parent))
        if prob is not None and self.probs is None:
            self.probs = [1.0] * n
        if self.probs is not None:
            self.probs.append(1.0 if prob is None else float(prob))
        if dist is not None and self.dists is None:
            self.dists = [None] * n
        if self.dists is not None:
            self.dists.append(dist)
        if source and self.sources is None:
            self.sources = [""] * n
        if self.sources is not None:
            self.sources.append(source)
        return n

    def __len__(self) -> int:
        return len(self.tokens)

    # ---- structure ------------------------------------------------------------------
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def children(self, node: int) -> list[int]:
        """Children of ``node`` (``-1`` = the root) in insertion order."""
        return [i for i, p in enumerate(self.parents) if p == node]

    def find_child(self, node: int, token: int) -> int:
        for i, p in enumerate(self.parents):
            if p == node and self.tokens[i] == token:
                return i
        return -1

    def follow(self, tokens: Sequence[int]) -> list[int]:
        """Nodes of the longest root path spelling a prefix of ``tokens``."""
        path, node = [], -1
        for t in tokens:
            node = self.find_child(node, int(t))
            if node < 0:
                break
            path.append(node)
        return path

    def depths(self) -> list[int]:
        """Depth of each node; children of the root have depth 0."""
        d: list[int] = []
        for p in self.parents:
            d.append(0 if p < 0 else d[p] + 1)
        return d

    def path_to(self, node: int) -> list[int]:
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def leaves(self) -> list[int]:
        has_child = set(p for p in self.parents if p >= 0)
        return [i for i in range(len(self.tokens)) if i not in has_child]

    def paths(self) -> list[list[int]]:
        """Every root-to-leaf path, as node indices."""
        return [self.path_to(leaf) for leaf in self.leaves()]

    def ancestor_mask(self) -> np.ndarray:
        """bool[n, n]: ``mask[i, j]`` is True when node ``j`` is ``i`` or an ancestor of ``i``."""
        n = len(self.tokens)
        m = np.zeros((n, n), dtype=bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                m[i] = m[p]
            m[i, i] = True
        return m

    def max_depth(self) -> int:
        return max(self.depths(), default=-1) + 1

    # ---- editing --------------------------------------------------------------------
    def subtree(self, nodes: Sequence[int]) -> DraftTree:
        """The tree restricted to ``nodes`` (must be closed under parent), renumbered."""
        keep = sorted(set(nodes))
        where = {old: new for new, old in enumerate(keep)}
        out = DraftTree()
        for old in keep:
            p = self.parents[old]
            if p >= 0 and p not in where:
                raise ValueError("subtree nodes must include every ancestor")
            out.add(
                self.tokens[old],
                -1 if p < 0 else where[p],
                prob=None if self.probs is None else self.probs[old],
                dist=None if self.dists is None else self.dists[old],
                source="" if self.sources is None else self.sources[old],
            )
        return out

    def truncated(self, max_nodes: int) -> DraftTree:
        """The first ``max_nodes`` nodes (insertion order keeps parents before children)."""
        return self if len(self) <= max_nodes else self.subtree(range(max_nodes))

    def merge(self, other: DraftTree) -> DraftTree:
        """Fuse ``other`` into a copy of this tree by longest-prefix matching (Talon).

        Every path of ``other`` follows existing nodes with equal tokens as long as it can and
        only the unmatched remainder is added as new nodes, so shared prefixes are verified
        once. Nodes keep the source tag of the tree that first proposed them.
        """
        out = self.subtree(range(len(self)))
        where: dict[int, int] = {}
        for i, (tok, p) in enumerate(zip(other.tokens, other.parents, strict=True)):
            parent = -1 if p < 0 else where[p]
            j = out.find_child(parent, tok)
            if j < 0:
                j = out.add(
                    tok,
                    parent,
                    prob=None if other.probs is None else other.probs[i],
                    dist=None if other.dists is None else other.dists[i],
                    source=(other.sources[i] if other.sources else "") or "merged",
                )
            where[i] = j
        return out

    def rooted(self, root_token: int) -> tuple[list[int], list[int]]:
        """Tokens and parents of the verification tree: ``root_token`` as node 0, then this tree."""
        return [int(root_token)] + self.tokens, [-1] + [p + 1 for p in self.parents]
