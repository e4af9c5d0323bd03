"""``elastic_bench_embed_mapper``: the embedding Mapper every benchmark contender runs (real or simulated).

One registered, batched Data-Juicer Mapper *without* the mixin, so "ours" is
always the recipe opt-in (``adaptive_batching: true`` builds
``(AdaptiveBatchingMixin, BenchEmbedMapper)``) and the operator's own cost
settings travel through that path (the opt-in keeps the operator's own hooks):

* ``cost_model``: None = the mixin's default; ``rows``, ``text``,
  ``padded_text``; ``tokens`` / ``padded_tokens`` = per-row token counts
  (the operator's ``adaptive_row_costs``) summed / padded to the longest row;
* ``sort``: None = the mixin's default; else ``adaptive_batching_sort``.

The encoder is a :class:`dje_gpu_bench.model.Encoder` built in ``__init__``
from ``encoder`` (a dict of :class:`~dje_gpu_bench.model.EncoderSpec`
fields: random weights, a tokenizer built in code), or one a caller attaches
with :meth:`attach` (the simulation's device).  Output: ``embedding`` (a list
of floats per row).
"""

from __future__ import annotations

from typing import Any

from data_juicer.ops.base_op import OPERATORS, Mapper

NAME = "elastic_bench_embed_mapper"
COST_MODELS = (None, "rows", "text", "padded_text", "tokens", "padded_tokens")


@OPERATORS.register_module(NAME)
class BenchEmbedMapper(Mapper):
    _batched_op = True
    _accelerator = "cuda"

    def __init__(
        self,
        cost_model: str | None = None,
        sort: bool | None = None,
        encoder: dict | None = None,
        *args: Any,
        **kwargs: Any,
    ):
        super().__init__(*args, **kwargs)
        if cost_model not in COST_MODELS:
            raise ValueError(f"cost_model must be one of {COST_MODELS}, got {cost_model!r}")
        self.token_costs = cost_model in ("tokens", "padded_tokens")
        if cost_model is not None:  # instance attributes: what the mixin reads
            self.adaptive_batching_cost = {"tokens": "text", "padded_tokens": "padded_text"}.get(cost_model, cost_model)
        if sort is not None:
            self.adaptive_batching_sort = bool(sort)
        self.encoder = None
        if encoder is not None:
            from dje_gpu_bench.model import Encoder, EncoderSpec

            self.encoder = Encoder(EncoderSpec(**encoder))

    def attach(self, encoder: Any) -> BenchEmbedMapper:
        self.encoder = encoder
        return self

    def adaptive_row_costs(self, batch: Any):
        if self.token_costs:
            return [float(n) for n in self.encoder.token_counts(list(batch[self.text_key]))]
        from data_juicer_elastic.batching.mixin import AdaptiveBatchingMixin

        return AdaptiveBatchingMixin.adaptive_row_costs(self, batch)

    def process_batched(self, samples: dict) -> dict:
        samples["embedding"] = self.encoder.embed(list(samples[self.text_key]))
        return samples
