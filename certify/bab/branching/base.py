"""What a branching rule is: it sees the candidate neurons of a batch of leaves and returns one
``Decision`` (or None) per leaf. One rule per module in this folder, on ``BranchingRule``."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from softcert.certify.bab.leaves import Decision


@dataclass(frozen=True)
class Candidate:
    """The neurons of one splittable node (the input of an operator with a ``SplitRule``) in a
    batch of B leaves: bounds ``l``, ``u`` (B, *shape); ``gl``, ``gu`` the gradients of the
    leaves' summed bound with respect to them (zeros where none reaches); ``rule`` the
    consuming operator's ``SplitRule``; ``alpha_grad`` (B, *shape) the summed |d bound / d alpha|
    of the optimisable elementwise maps it feeds, or None."""

    l: torch.Tensor
    u: torch.Tensor
    gl: torch.Tensor
    gu: torch.Tensor
    rule: object
    alpha_grad: torch.Tensor | None = None


class BranchingRule:
    """Base class: ``decide(candidates, batch)`` -> [Decision or None] per leaf, from
    ``candidates`` (node id -> ``Candidate``), made on the device by ``choose`` (the engine
    reads its table back with the leaves' values, in one transfer); a subclass defines
    ``score``."""

    def score(self, c: Candidate, p: torch.Tensor) -> torch.Tensor:
        """Scores (B, *shape) of splitting each neuron at ``p`` (higher first)."""
        raise NotImplementedError

    def choose(self, candidates, batch):
        """Per leaf, the neuron of highest finite score over every candidate node (the first
        node wins ties), split at its rule's point, chosen on the tensors' device without
        reading anything back: (nodes, table) with ``nodes`` the candidate node ids and
        ``table`` (batch, 6) float64 rows (found 1/0, position in ``nodes``, flat index, lo,
        hi, point), exact (indices below 2^53; ``decisions`` makes them ``Decision``s); None
        when there is no candidate node."""
        nodes, scores, index, values = [], [], [], []
        with torch.no_grad():
            for i, c in candidates.items():
                p = c.rule.point(c.l, c.u)
                score = self.score(c, p)
                score = torch.where(torch.isnan(p) | torch.isnan(score), -torch.inf, score).view(batch, -1)
                s, ix = score.max(1)
                nodes.append(i)
                scores.append(s.double())
                index.append(ix)
                values.append(torch.stack([_at(t, ix) for t in (c.l, c.u, p)], 1))
            if not nodes:
                return None
            # the first node of the highest score (argmax takes the first maximum), if finite above -inf
            scores = torch.stack(scores)
            k = scores.argmax(0)
            rows = torch.arange(batch, device=k.device)
            found = scores[k, rows] > -torch.inf
            ints = torch.stack([found.long(), k, torch.stack(index)[k, rows]], 1).double()
            return nodes, torch.cat([ints, torch.stack(values)[k, rows]], 1)

    @staticmethod
    def decisions(nodes, rows):
        """[Decision or None] per leaf from ``choose``'s ``nodes`` and its table read to the
        host (``rows``: one list of six numbers per leaf)."""
        return [Decision(nodes[int(n)], int(j), lo, hi, point) if found else None
                for found, n, j, lo, hi, point in rows]

    def decide(self, candidates, batch):
        """``choose``'s decisions read back at once: [Decision or None] per leaf."""
        chosen = self.choose(candidates, batch)
        if chosen is None:
            return [None] * batch
        return self.decisions(chosen[0], chosen[1].tolist())


def _at(t, ix):
    """t (B, *shape) at the flat index ix[b] of each leaf b, as float64 (exact): (B,)."""
    return t.reshape(t.shape[0], -1).gather(1, ix[:, None]).squeeze(1).double()
