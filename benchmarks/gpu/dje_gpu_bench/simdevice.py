"""A simulated CUDA device running a BERT-like encoder: memory and time on a virtual clock.

What a real transformer does with a micro-batch of ``n`` texts (padded to the
longest, ``L`` tokens) and what the caching allocator does around it:

* memory: ``n x L x act`` (hidden states, the feed-forward intermediate) plus
  ``n x L^2 x score`` (eager attention's scores and probabilities: heads x
  2 bytes x 2 per element); over ``capacity`` -> ``torch.OutOfMemoryError``;
* time of a call: a fixed cost (Python, kernel launches, the copy back),
  tokenization per character, ``token`` per padded token and ``score`` per
  attention element;
* an OOM wastes U(0.3, 1) of the call (it fails part-way) plus ``oom`` (the
  allocator frees its cache and raises; the controller's ``gc.collect`` and
  ``empty_cache``), and leaves nothing reserved;
* fragmentation: the caching allocator keeps the blocks of earlier calls; a call
  whose shape (rows, L) differs from the previous one reuses only ``reuse`` of
  what is reserved, and when the new blocks would take the reserve over the cap
  the allocator frees its whole cache and allocates again (``flush`` plus
  ``grow`` per GiB); and a call of a new shape carves its tensors out of the
  previous call's segments, so up to ``frag`` of the previous call's memory is
  lost to split blocks that cannot be released (a random share per call): a
  size that fitted after a cleanup can fail after a large call of another shape,
  and cleanup (``empty_cache``) cures it.

:class:`Calibration` holds the constants; ``simulate.py`` explains the chosen
values (fitted so the simulation reproduces the order measured on an H200).
The same memory formula forces OOMs in the benchmark's CPU dry run.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

GIB = float(2**30)


@dataclass(frozen=True)
class Calibration:
    capacity_mib: float = 1500.0  # room for activations under the allocator cap (cap - weights - workspace)
    act_kib_per_token: float = 16.0
    score_bytes: float = 48.0  # per row per L^2 (eager attention); sdpa: about 2
    call_ms: float = 6.0
    token_us: float = 1.0
    score_ns: float = 0.4
    char_ns: float = 20.0
    oom_ms: float = 200.0
    grow_ms_per_gib: float = 20.0
    flush_ms: float = 40.0
    reuse: float = 0.3
    frag: float = 0.25

    def memory(self, rows: int, length: int) -> float:
        return rows * length * (self.act_kib_per_token * 1024 + self.score_bytes * length)

    def fits(self, rows: int, length: int) -> bool:
        return self.memory(rows, length) <= self.capacity_mib * 2**20


def out_of_memory(message: str) -> Exception:
    try:
        import torch

        return torch.OutOfMemoryError(message)
    except ImportError:  # the simulation runs without torch: a RuntimeError with CUDA's message
        return RuntimeError(f"CUDA out of memory. {message}")


class SimEncoder:
    """The encoder interface (``embed``, ``token_counts``, counters) on the simulated device."""

    def __init__(self, calibration: Calibration, counts: dict[str, int], seed: int = 0):
        self.cal = calibration
        self.counts = counts  # text -> tokens under the benchmark's tokenizer (truncated)
        self.seed = seed
        self.clock = 0.0
        self._reserved = 0.0
        self._shape: tuple[int, int] | None = None
        self._previous = 0.0  # memory of the previous call, while its segments are cached
        self._calls = 0
        self.reset_counters()

    def reset_counters(self) -> None:
        self.sizes: list[int] = []
        self.ooms = 0
        self.busy_secs = 0.0  # time of the calls that succeeded (the device did useful work)
        self.padded_tokens = 0
        self.real_tokens = 0
        self.peak_bytes = 0.0

    def now(self) -> float:
        return self.clock

    def sleep(self, secs: float) -> None:
        self.clock += secs

    def token_counts(self, texts: list[str]) -> list[int]:
        return [self.counts[text] for text in texts]

    def embed_rows(self, texts: list[str]) -> list[list[float]]:
        """What ``embed`` returns for each row, without a device (the reference)."""
        return [[float(t), float(len(text))] for t, text in zip(self.token_counts(texts), texts, strict=True)]

    def embed(self, texts: list[str]) -> list[list[float]]:
        cal, self._calls = self.cal, self._calls + 1
        tokens = self.token_counts(texts)
        n, length = len(texts), max(tokens)
        need = cal.memory(n, length)
        secs = (
            cal.call_ms / 1e3
            + cal.char_ns / 1e9 * sum(map(len, texts))
            + cal.token_us / 1e6 * n * length
            + cal.score_ns / 1e9 * n * length * length
        )
        draw = random.Random(f"{self.seed}-{self._calls}")
        cap = cal.capacity_mib * 2**20
        usable = self._reserved if (n, length) == self._shape else cal.reuse * self._reserved
        if need > usable and self._reserved + need - usable > cap:
            secs += cal.flush_ms / 1e3  # the allocator frees its cache (synchronising) to make room
            self._reserved = usable = 0.0
        split = 0.0 if (n, length) == self._shape else cal.frag * draw.random() * self._previous
        if need > cap - split:
            self.clock += (0.3 + 0.7 * draw.random()) * secs + cal.oom_ms / 1e3
            self._reserved, self._shape, self._previous = 0.0, None, 0.0  # cleanup empties the cache
            self.ooms += 1
            raise out_of_memory(f"Tried to allocate {need / 2**20:.0f} MiB for {n} rows x {length} tokens")
        if need > usable:
            secs += cal.grow_ms_per_gib / 1e3 * (need - usable) / GIB
            self._reserved += need - usable
        self._shape, self._previous = (n, length), need
        self.clock += secs
        self.busy_secs += secs
        self.sizes.append(n)
        self.padded_tokens += n * length
        self.real_tokens += sum(tokens)
        self.peak_bytes = max(self.peak_bytes, need)
        return self.embed_rows(texts)
