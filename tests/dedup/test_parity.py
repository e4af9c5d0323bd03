"""Parity with Data-Juicer's own deduplicators: for generated corpora (copies far apart, case and
punctuation variants, near copies, short and empty documents) split into 1, 2, 7 shards or one row per
shard, the rows the phases keep (signatures -> bucket tasks -> cluster step) are exactly the rows the
operator's own ``process`` keeps on the whole dataset.  Every hash comes from the operator's own
``compute_hash``; the operators are instantiated here, in the test, never in the package."""

from __future__ import annotations

import functools
import string

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.dedup import keys, simhash_blocks
from tests.dedup.pipeline import kept_rows, split_rows

datasets = pytest.importorskip("datasets")
WORDS = ["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
SHARDINGS = [1, 2, 7, "per-row"]
TOKENIZATIONS = ["space", "punctuation", "character"]


@st.composite
def corpora(draw, max_rows: int = 40) -> list[str]:
    """Rows in input order; later rows often derive from earlier ones, anywhere before them."""
    rows: list[str] = []
    for _ in range(draw(st.integers(0, max_rows))):
        kind = draw(st.sampled_from(["new", "copy", "case", "punct", "near", "short", "empty"]))
        if kind == "new" or (not rows and kind in ("copy", "case", "punct", "near")):
            rows.append(" ".join(draw(st.lists(st.sampled_from(WORDS), min_size=3, max_size=14))))
            continue
        if kind == "short":
            rows.append(" ".join(draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3))))
            continue
        if kind == "empty":
            rows.append(draw(st.sampled_from(["", " ", "\n"])))
            continue
        source = rows[draw(st.integers(0, len(rows) - 1))]
        if kind == "copy":
            rows.append(source)
        elif kind == "case":
            rows.append(source.upper() if draw(st.booleans()) else source.title())
        elif kind == "punct":
            rows.append(source.replace(" ", draw(st.sampled_from([", ", ". ", " - ", "  ", " 1 "]))) + "!")
        else:
            words = source.split() or ["x"]
            at = draw(st.integers(0, len(words) - 1))
            words[at] = draw(st.sampled_from(WORDS + list(string.ascii_lowercase)))
            rows.append(" ".join(words + draw(st.lists(st.sampled_from(WORDS), max_size=2))))
    return rows


def operator_keeps(op, texts: list[str]) -> tuple[list[int], list[dict]]:
    """The input rows the operator's own ``process`` keeps, and the rows its ``compute_hash`` made."""
    hashed = [op.compute_hash({"text": text, "index": index}) for index, text in enumerate(texts)]
    if not hashed:
        return [], hashed
    kept, _ = op.process(datasets.Dataset.from_list(hashed))
    return list(kept["index"]), hashed


def shard_count(sharding, rows: int) -> int:
    return max(1, rows) if sharding == "per-row" else sharding


@functools.cache
def exact_op(lowercase: bool, ignore_non_character: bool):
    from data_juicer.ops.deduplicator.document_deduplicator import DocumentDeduplicator

    return DocumentDeduplicator(lowercase=lowercase, ignore_non_character=ignore_non_character)


@functools.cache
def minhash_op(small: bool, tokenization: str = "space"):
    from data_juicer.ops.deduplicator.document_minhash_deduplicator import DocumentMinhashDeduplicator

    if small:  # few, short bands: near copies collide often
        return DocumentMinhashDeduplicator(
            tokenization=tokenization, window_size=2, num_permutations=12, num_bands=6, num_rows_per_band=2
        )
    return DocumentMinhashDeduplicator()  # Data-Juicer's defaults: 25 bands of 10, from optimal_param


@functools.cache
def simhash_op(small: bool, tokenization: str = "space"):
    pytest.importorskip("simhash", reason="SimHash needs simhash-pybind (pip install simhash-pybind==0.0.3)")
    from data_juicer.ops.deduplicator.document_simhash_deduplicator import DocumentSimhashDeduplicator

    if small:  # short shingles, and 3 blocks for distance 2: other bands than the default 15
        return DocumentSimhashDeduplicator(tokenization=tokenization, window_size=2, num_blocks=3, hamming_distance=2)
    return DocumentSimhashDeduplicator()


def ours(tmp_path, method, hashed, sharding, **kwargs):
    rows = len(hashed)
    if method == "exact":
        found = keys.exact_keys([row["__dj__hash"] for row in hashed])
    elif method == "minhash":
        found = keys.minhash_keys([row["__dj__minhash"] for row in hashed])
    else:
        values = keys.simhash_values([row["__dj__simhash"] for row in hashed])
        found = simhash_blocks.simhash_keys(values, kwargs["num_blocks"], kwargs["distance"])
    if rows == 0:
        return []
    return kept_rows(
        tmp_path,
        found,
        shard_count(sharding, rows),
        method,
        distance=kwargs.get("distance", 0),
        grouped=kwargs.get("grouped", False),
        merged=kwargs.get("merged", False),
    )


FAST = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.mark.parametrize("sharding", SHARDINGS)
@FAST
@given(texts=corpora(), lowercase=st.booleans(), ignore=st.booleans())
def test_exact_keeps_the_rows_document_deduplicator_keeps(tmp_path_factory, sharding, texts, lowercase, ignore):
    expected, hashed = operator_keeps(exact_op(lowercase, ignore), texts)
    assert ours(tmp_path_factory.mktemp("x"), "exact", hashed, sharding) == expected


@pytest.mark.parametrize("sharding", SHARDINGS)
@FAST
@given(
    texts=corpora(),
    small=st.booleans(),
    tokenization=st.sampled_from(TOKENIZATIONS),
    grouped=st.booleans(),
    merged=st.booleans(),
)
def test_minhash_keeps_the_rows_document_minhash_deduplicator_keeps(
    tmp_path_factory, sharding, texts, small, tokenization, grouped, merged
):
    """Bucket tasks one band each or grouped by range; edge files merged into forests or not."""
    expected, hashed = operator_keeps(minhash_op(small, tokenization if small else "space"), texts)
    found = ours(tmp_path_factory.mktemp("m"), "minhash", hashed, sharding, grouped=grouped, merged=merged)
    assert found == expected


@pytest.mark.parametrize("sharding", SHARDINGS)
@FAST
@given(
    texts=corpora(),
    small=st.booleans(),
    tokenization=st.sampled_from(TOKENIZATIONS),
    grouped=st.booleans(),
    merged=st.booleans(),
)
def test_simhash_keeps_the_rows_document_simhash_deduplicator_keeps(
    tmp_path_factory, sharding, texts, small, tokenization, grouped, merged
):
    op = simhash_op(small, tokenization if small else "space")
    expected, hashed = operator_keeps(op, texts)
    found = ours(
        tmp_path_factory.mktemp("s"),
        "simhash",
        hashed,
        sharding,
        num_blocks=op.num_blocks,
        distance=op.hamming_distance,
        grouped=grouped,
        merged=merged,
    )
    assert found == expected


def test_every_document_shorter_than_the_window_falls_in_one_minhash_cluster(tmp_path):
    """Data-Juicer gives a document with fewer tokens than the window an all-max signature: every such
    document collides with every other in every band, and only the first is kept (no Jaccard check)."""
    texts = ["alpha beta", "one two three four five six", "gamma", "", "delta eps zeta", "seven eight nine ten eleven"]
    expected, hashed = operator_keeps(minhash_op(False), texts)
    assert expected == [0, 1, 5]
    for sharding in SHARDINGS:
        assert ours(tmp_path / str(sharding), "minhash", hashed, sharding) == expected


def shard_sizes_after(kept: list[int], sizes: list[int]) -> list[int]:
    """Each shard's rows after a stage kept ``kept`` (indices of the stage's rows, shards contiguous)."""
    bounds, out = [0], []
    for size in sizes:
        bounds.append(bounds[-1] + size)
    for low, high in zip(bounds, bounds[1:], strict=False):
        out.append(sum(low <= row < high for row in kept))
    return out


@pytest.mark.parametrize("sharding", SHARDINGS)
@FAST
@given(texts=corpora())
def test_two_deduplicators_with_a_mapper_and_a_filter_between_them(tmp_path_factory, sharding, texts):
    """exact -> a Mapper (lower case) and a Filter (at least two words) -> MinHash: the second stage's
    rows are numbered within the stage, shard by shard, and the chain keeps what Data-Juicer keeps."""

    def between(rows: list[str]) -> list[int]:
        return [index for index, text in enumerate(rows) if len(text.split()) >= 2]

    exact, minhash = exact_op(False, False), minhash_op(True)
    first, hashed = operator_keeps(exact, texts)
    survivors = [texts[row].lower() for row in first]
    passing = between(survivors)
    second, _ = operator_keeps(minhash, [survivors[i] for i in passing])
    expected = [first[passing[i]] for i in second]

    if not texts:
        return
    root = tmp_path_factory.mktemp("chain")
    sizes = split_rows(len(texts), shard_count(sharding, len(texts)))
    kept1 = kept_rows(root / "1", keys.exact_keys([row["__dj__hash"] for row in hashed]), sizes, "exact")
    rows1 = [texts[row].lower() for row in kept1]
    sizes1 = shard_sizes_after(kept1, sizes)
    keep_filter = between(rows1)
    sizes2 = shard_sizes_after(keep_filter, sizes1)
    stage2 = [minhash.compute_hash({"text": rows1[i]})["__dj__minhash"] for i in keep_filter]
    if not stage2:
        assert expected == []
        return
    kept2 = kept_rows(root / "2", keys.minhash_keys(stage2), sizes2, "minhash")
    assert [kept1[keep_filter[i]] for i in kept2] == expected


@pytest.mark.extended
@pytest.mark.parametrize("method", ["exact", "minhash", "simhash"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    texts=corpora(max_rows=300),
    sharding=st.sampled_from(SHARDINGS + [3, 16]),
    small=st.booleans(),
    grouped=st.booleans(),
    merged=st.booleans(),
)
def test_larger_corpora_keep_the_operators_rows(tmp_path_factory, method, texts, sharding, small, grouped, merged):
    ways = {"grouped": grouped, "merged": merged}
    root = tmp_path_factory.mktemp("large")
    if method == "exact":
        expected, hashed = operator_keeps(exact_op(small, small), texts)
        assert ours(root, "exact", hashed, sharding, **ways) == expected
    elif method == "minhash":
        expected, hashed = operator_keeps(minhash_op(small), texts)
        assert ours(root, "minhash", hashed, sharding, **ways) == expected
    else:
        op = simhash_op(small)
        expected, hashed = operator_keeps(op, texts)
        assert (
            ours(root, "simhash", hashed, sharding, num_blocks=op.num_blocks, distance=op.hamming_distance, **ways)
            == expected
        )
