"""Generated texts with long-tailed lengths and the word-level vocabulary they use (no download).

Shared by the real-GPU benchmark (``bench.py``: the tokenizer is built from
:func:`vocabulary`) and the simulation (``simulate.py``: token counts come from
:func:`token_counts` without any tokenizer), so both see the same rows.

* words per text: lognormal (median ``median_words``, sigma ``sigma``), at least 3,
  at most ``max_words``; about 0.2% of texts exceed 510 words and are truncated
  by the tokenizer (``max_length`` 512 tokens with [CLS] and [SEP]), as real
  corpora have a few giant documents;
* words: drawn Zipf-like from a generated vocabulary of pronounceable strings of
  2-12 letters.  The tokenizer (``model.build_tokenizer``) is a WordPiece over the
  ``common_words`` most frequent words plus syllable pieces, so a rare word
  splits into several tokens, as with a real subword tokenizer; each text has its
  own share of rare words (Beta-distributed: chat vs. technical prose), so
  characters per token vary from text to text and a character count is a noisy
  proxy for tokens.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from itertools import accumulate

SPECIAL = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_CONSONANTS = "bcdfghjklmnprstvwz"
_VOWELS = "aeiou"


@dataclass(frozen=True)
class CorpusSpec:
    rows: int = 13_824
    seed: int = 0
    median_words: float = 28.0
    sigma: float = 0.9
    max_words: int = 1_200
    vocab_size: int = 8_000
    common_words: int = 2_000  # whole-word tokens; the rest split into syllable pieces
    max_length: int = 512  # tokens, [CLS] and [SEP] included


def vocabulary(spec: CorpusSpec) -> list[str]:
    """``spec.vocab_size`` distinct lower-case words, deterministic in ``spec.seed``."""
    rng = random.Random(f"vocab-{spec.seed}")
    words: dict[str, None] = {}
    while len(words) < spec.vocab_size:
        n = min(12, max(2, round(rng.lognormvariate(math.log(5.5), 0.4))))
        words["".join(rng.choice(_CONSONANTS if i % 2 == 0 else _VOWELS) for i in range(n))] = None
    return list(words)


def syllables() -> list[str]:
    """Every consonant-vowel pair and single letter: the pieces a rare word is split into."""
    return [c + v for c in _CONSONANTS for v in _VOWELS] + list(_CONSONANTS + _VOWELS)


def texts(spec: CorpusSpec) -> list[str]:
    vocab = vocabulary(spec)
    common, rare = vocab[: spec.common_words], vocab[spec.common_words :]
    common_weights = list(accumulate(1.0 / (rank + 10) for rank in range(len(common))))  # Zipf-like
    rare_weights = list(accumulate(1.0 / (rank + 10) for rank in range(len(common), len(vocab))))
    rng = random.Random(f"texts-{spec.seed}")
    out = []
    for _ in range(spec.rows):
        n = int(min(spec.max_words, max(3, rng.lognormvariate(math.log(spec.median_words), spec.sigma))))
        n_rare = round(n * rng.betavariate(1.2, 4.5))  # this text's share of rare words (mean 0.21)
        words = rng.choices(common, cum_weights=common_weights, k=n - n_rare)
        words += rng.choices(rare, cum_weights=rare_weights, k=n_rare)
        rng.shuffle(words)
        out.append(" ".join(words))
    return out
