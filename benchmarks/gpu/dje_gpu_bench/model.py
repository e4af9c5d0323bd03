"""A real transformer encoder with random weights and a tokenizer built in code: nothing is downloaded.

``EncoderSpec`` defaults are bert-base sized (12 layers, hidden 768, 12 heads,
fp16 on CUDA) with eager attention, whose scores take rows x heads x L^2 memory
as the H200 measurement (docs/adaptive-batching.md) did; ``tiny()`` is the CPU dry run's model.  The
tokenizer is a ``tokenizers`` WordPiece model over the corpus's common words
and syllable pieces (rare words split; [CLS] ... [SEP], truncation at
``max_length``, padding to the longest row of the call, as Hugging Face
tokenizers do).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, replace

from dje_gpu_bench import corpus


@dataclass(frozen=True)
class EncoderSpec:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    intermediate: int = 3072
    max_length: int = 512
    attention: str = "eager"  # "eager": scores materialised (rows x heads x L^2); "sdpa": fused kernels
    dtype: str = "float16"
    device: str = "cuda"
    weights_seed: int = 0
    vocab_seed: int = 0  # the corpus seed whose vocabulary the tokenizer knows
    vocab_size: int = corpus.CorpusSpec.vocab_size  # the corpus's words; the tokenizer keeps the common ones
    output_dims: int | None = None  # keep only the first dims of each embedding (smaller sharded outputs)
    cap_gib: float | None = None  # CUDA: cap this process's allocator (weights included) when the encoder is built
    forced_oom_mib: float | None = None  # CPU dry run: raise OutOfMemoryError above this simulated activation size

    @classmethod
    def tiny(cls, **changes) -> EncoderSpec:
        base = cls(layers=2, hidden=64, heads=4, intermediate=128, dtype="float32", device="cpu")
        return replace(base, **changes)

    def to_dict(self) -> dict:
        return asdict(self)


def build_tokenizer(spec: EncoderSpec, *, padding: bool = True):
    """WordPiece over the corpus's common words and syllable pieces (``tokenizers`` only: no torch)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    corpus_spec = corpus.CorpusSpec(seed=spec.vocab_seed, vocab_size=spec.vocab_size)
    pieces = corpus.syllables()
    words = [*corpus.SPECIAL, *corpus.vocabulary(corpus_spec)[: corpus_spec.common_words]]
    words += [p for p in pieces if p not in set(words)] + ["##" + p for p in pieces]
    vocab = {word: i for i, word in enumerate(dict.fromkeys(words))}
    tokenizer = Tokenizer(models.WordPiece(vocab=vocab, unk_token="[UNK]", max_input_chars_per_word=100))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])]
    )
    tokenizer.enable_truncation(max_length=spec.max_length)
    if padding:
        tokenizer.enable_padding(pad_id=vocab["[PAD]"], pad_token="[PAD]")
    return tokenizer


class Encoder:
    """Texts -> mean-pooled, L2-normalised embeddings; counts its busy time and the padded tokens it ran."""

    def __init__(self, spec: EncoderSpec):
        import torch
        from transformers import BertConfig, BertModel

        self.spec = spec
        self.torch = torch
        self.tokenizer = build_tokenizer(spec)
        self.counter = build_tokenizer(spec, padding=False)
        config = BertConfig(
            vocab_size=self.tokenizer.get_vocab_size(),
            hidden_size=spec.hidden,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            intermediate_size=spec.intermediate,
            max_position_embeddings=spec.max_length,
        )
        config._attn_implementation = spec.attention
        torch.manual_seed(spec.weights_seed)
        self.device = torch.device(spec.device)
        self.model = BertModel(config, add_pooling_layer=False).to(self.device, getattr(torch, spec.dtype)).eval()
        if spec.cap_gib and self.device.type == "cuda":
            cap_memory(spec.cap_gib, self.device)
        self.forced = None
        if spec.forced_oom_mib:
            from dje_gpu_bench.simdevice import Calibration

            self.forced = Calibration(capacity_mib=spec.forced_oom_mib)
        self.reset_counters()

    def reset_counters(self) -> None:
        self.busy_secs = 0.0
        self.sizes: list[int] = []  # rows of each call that succeeded
        self.ooms = 0
        self.padded_tokens = 0
        self.real_tokens = 0

    def token_counts(self, texts: list[str]) -> list[int]:
        return [len(encoding.ids) for encoding in self.counter.encode_batch(texts)]

    def embed(self, texts: list[str]) -> list[list[float]]:
        torch = self.torch
        start = time.perf_counter()
        encodings = self.tokenizer.encode_batch(texts)
        if self.forced is not None and not self.forced.fits(len(encodings), len(encodings[0].ids)):
            from dje_gpu_bench.simdevice import out_of_memory

            self.ooms += 1  # the dry run's stand-in for a real CUDA OOM: same class, same handling
            raise out_of_memory(f"forced: {len(encodings)} rows x {len(encodings[0].ids)} tokens (dry run)")
        ids = torch.tensor([e.ids for e in encodings], dtype=torch.long)
        mask = torch.tensor([e.attention_mask for e in encodings], dtype=torch.long)
        try:
            with torch.inference_mode():
                ids, mask = ids.to(self.device), mask.to(self.device)
                hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
                weights = mask.unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1)
                out = torch.nn.functional.normalize(pooled.float(), dim=-1)
                if self.spec.output_dims:
                    out = out[:, : self.spec.output_dims]
                rows = out.cpu().tolist()  # synchronises: busy time covers the device's work
        except torch.OutOfMemoryError:
            self.ooms += 1
            raise
        self.busy_secs += time.perf_counter() - start  # useful work only: failed calls are waste
        self.sizes.append(len(texts))
        self.padded_tokens += int(ids.numel())
        self.real_tokens += int(mask.sum())
        return rows


def cap_memory(cap_gib: float, device) -> float:
    """Cap this process's CUDA caching allocator at ``cap_gib`` (weights included): real OOMs at realistic
    batch sizes on a large GPU.  Returns the fraction set."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    fraction = min(1.0, cap_gib * 2**30 / torch.cuda.get_device_properties(device).total_memory)
    torch.cuda.set_per_process_memory_fraction(fraction, device)
    return fraction
