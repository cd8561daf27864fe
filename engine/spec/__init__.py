"""Speculative decoding: cheap proposers draft k tokens, the target verifies them in one pass.

- `ngram.py`: prompt lookup (copy what followed an earlier occurrence of the last n tokens).
- `rejection.py`: the verifier: greedy matching, or the lossless rejection sampler of
  Leviathan et al. 2023 / Chen et al. 2023 (chapter 6.4, the third fix).
- `int8.py`: weight-only int8 linear layers, for a built-in draft made from the target's
  own weights.
"""

from engine.spec.ngram import NgramProposer, propose_ngram
from engine.spec.rejection import (
    DraftToken,
    SpecDecision,
    greedy_decision,
    rejection_sample,
    rejection_sample_batch,
    verify_greedy,
)

__all__ = [
    "DraftToken",
    "NgramProposer",
    "SpecDecision",
    "greedy_decision",
    "propose_ngram",
    "rejection_sample",
    "rejection_sample_batch",
    "verify_greedy",
]
