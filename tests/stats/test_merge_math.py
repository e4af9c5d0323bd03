"""The merge math: summaries of any split, merged in order, equal the summary of all rows;
and the summary agrees with pandas' describe (what dj-analyze's overall.csv holds)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from data_juicer_elastic.errors import JobDirError
from data_juicer_elastic.stats.columns import ALPHA, MAX_DISTINCT, ColumnKind, Moments, QuantileSketch
from data_juicer_elastic.stats.overall import column_facts, overall_csv
from data_juicer_elastic.stats.shard_summary import StatsSummary, merge_summaries

STATS = "__dj__stats__"
PERCENTILES = [0.1, 0.25, 0.5, 0.75, 0.9]

finite = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False, allow_infinity=False)
number = st.one_of(finite, st.integers(min_value=-(10**6), max_value=10**6))
# one row's stats: a numeric stat (sometimes missing / null), a string stat, a list stat
row = st.fixed_dictionaries(
    {},
    optional={
        "num": st.one_of(number, st.none()),
        "lang": st.sampled_from(["en", "zh", "fr"]),
        "lens": st.lists(st.integers(min_value=0, max_value=500), max_size=4),
    },
).map(lambda stats: {"text": "t", STATS: stats})


def split_points(n: int) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(min_value=0, max_value=n), max_size=6).map(sorted)


def chunks(rows: list, cuts: list[int]) -> list[list]:
    bounds = [0, *cuts, len(rows)]
    return [rows[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def close(a: float | None, b: float | None, scale: float) -> bool:
    if a is None or b is None:
        return a is b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9 * max(scale, 1.0))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(row, max_size=60), data=st.data())
def test_merging_any_split_equals_the_summary_of_the_concatenation(rows, data):
    cuts = data.draw(split_points(len(rows)))
    # through the record encoding, as finalize reads them
    parts = [StatsSummary.parse(StatsSummary.of_rows(chunk).encode(), "t") for chunk in chunks(rows, cuts)]
    merged, whole = merge_summaries(parts), StatsSummary.of_rows(rows)
    assert merged.rows == whole.rows == len(rows)
    assert [c.key for c in merged.columns] == [c.key for c in whole.columns]
    for got, want in zip(merged.columns, whole.columns, strict=True):
        assert got.kind == want.kind
        if got.kind is ColumnKind.NUMERIC:
            m, w = got.moments, want.moments
            scale = max(abs(w.min), abs(w.max))
            assert (m.count, m.min, m.max) == (w.count, w.min, w.max)
            assert close(m.mean, w.mean, scale) and close(m.std, w.std, scale)
            # sketches merge by adding bin counts: identical, so quantiles are identical too
            assert got.sketch.to_dict() == want.sketch.to_dict()
        elif got.kind is ColumnKind.CATEGORICAL:
            assert (got.categorical_count, got.values) == (want.categorical_count, want.values)


def _describe(values: list) -> pd.Series:
    """What Data-Juicer's OverallAnalysis computes for one column."""
    col = pd.Series(values, dtype="object" if any(isinstance(v, list | str) for v in values) else None)
    valid = col.dropna()
    if len(valid) and isinstance(valid.iloc[0], list):
        col = col.explode().infer_objects()
    return col.describe(percentiles=PERCENTILES, include="all")


def _check_quantile(estimate: float, exact: np.ndarray, q: float) -> None:
    """The stated bound: within ALPHA of both sorted values pandas interpolates between."""
    h = q * (len(exact) - 1)
    lo, hi = exact[math.floor(h)], exact[math.ceil(h)]
    pandas_value = lo + (h - math.floor(h)) * (hi - lo)
    bound = ALPHA * max(abs(lo), abs(hi)) * (1 + 1e-9) + 1e-12
    assert abs(estimate - pandas_value) <= bound, (q, estimate, pandas_value, lo, hi)


@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.one_of(number, st.none()), min_size=1, max_size=300))
def test_numeric_column_matches_pandas_describe(values):
    summary = StatsSummary.of_rows({STATS: {"x": v}} for v in values)
    (column,) = summary.columns
    expected = _describe(values)
    present = np.sort(np.array([v for v in values if v is not None], dtype=np.float64))
    if present.size == 0:
        assert column.count == 0
        return
    facts = column_facts(column, PERCENTILES)
    assert facts["count"] == expected["count"]
    scale = float(np.abs(present).max())
    assert close(facts["mean"], float(expected["mean"]), scale)
    assert close(facts["std"], None if present.size < 2 else float(expected["std"]), scale)
    assert (facts["min"], facts["max"]) == (expected["min"], expected["max"])
    for q in PERCENTILES:
        label = f"{q * 100:g}%"
        _check_quantile(facts[label], present, q)
        assert math.isclose(float(expected[label]), float(np.quantile(present, q)), rel_tol=1e-9, abs_tol=1e-6)


@settings(max_examples=60, deadline=None)
@given(values=st.lists(st.sampled_from(["a", "b", "c", None, True]), min_size=1, max_size=80))
def test_categorical_columns_match_pandas_or_are_skipped_when_mixed(values):
    summary = StatsSummary.of_rows({STATS: {"s": v}} for v in values)
    (column,) = summary.columns
    present = [v for v in values if v is not None]
    kinds = {type(v) for v in present}
    if len(kinds) > 1:
        assert column.kind is ColumnKind.SKIPPED and "mixes" in column.reason
        return
    if not present:
        assert column.count == 0
        return
    expected = pd.Series(present).describe()
    facts = column_facts(column, PERCENTILES)
    assert (facts["count"], facts["unique"], facts["freq"]) == (expected["count"], expected["unique"], expected["freq"])
    ties = {v for v in set(present) if present.count(v) == expected["freq"]}
    assert facts["top"] in ties and expected["top"] in ties


def test_lists_are_flattened_like_explode_and_objects_are_skipped():
    rows = [
        {STATS: {"lens": [3, 4], "obj": {"a": 1}, "mixed": [1]}},
        {STATS: {"lens": [], "mixed": 2}},
        {STATS: {"lens": [5]}, "__dj__meta__": {"__dj__tag": "x", "user": "ignored"}},
    ]
    summary = StatsSummary.of_rows(rows)
    by_name = {c.name: c for c in summary.columns}
    assert list(by_name) == ["lens", "obj", "mixed", "__dj__tag"]  # stats first, then meta tags
    lens = column_facts(by_name["lens"], PERCENTILES)
    assert (lens["count"], lens["min"], lens["max"], lens["mean"]) == (3, 3.0, 5.0, 4.0)
    assert by_name["obj"].kind is ColumnKind.SKIPPED and "dict" in by_name["obj"].reason
    assert by_name["mixed"].kind is ColumnKind.SKIPPED and "lists" in by_name["mixed"].reason
    assert column_facts(by_name["__dj__tag"], PERCENTILES)["top"] == "x"
    assert "user" not in by_name


def test_numbers_beyond_float_range_skip_the_column_instead_of_failing():
    summary = StatsSummary.of_rows([{STATS: {"big": 10**400, "ok": 1}}, {STATS: {"big": 1, "ok": 2}}])
    by_name = {c.name: c for c in summary.columns}
    assert by_name["big"].kind is ColumnKind.SKIPPED and "float range" in by_name["big"].reason
    assert by_name["ok"].moments.count == 2
    StatsSummary.parse(summary.encode(), "t")  # still a valid record


def test_categorical_value_counts_stop_past_the_cap_but_count_stays_exact():
    rows = [{STATS: {"s": f"v{i}"}} for i in range(MAX_DISTINCT + 5)]
    half = len(rows) // 2
    merged = merge_summaries([StatsSummary.of_rows(rows[:half]), StatsSummary.of_rows(rows[half:])])
    facts = column_facts(merged.columns[0], PERCENTILES)
    assert facts == {"count": MAX_DISTINCT + 5, "unique": None, "top": None, "freq": None}


def test_sketch_handles_negatives_zero_and_a_single_value():
    sketch = QuantileSketch()
    sketch.add_array(np.array([-100.0, -1.0, 0.0, 0.0, 2.0, 1e6]))
    assert all(sketch.value_at_rank(r) == pytest.approx(v, rel=ALPHA) for r, v in enumerate([-100, -1, 0, 0, 2, 1e6]))
    assert sketch.value_at_rank(2) == 0.0
    one = QuantileSketch()
    one.add_array(np.array([7.0]))
    assert one.quantile(0.5) == pytest.approx(7.0, rel=ALPHA)
    assert QuantileSketch().quantile(0.5) is None


def test_bulk_keys_are_the_logarithmic_mappings_keys():
    """add_array computes DDSketch's keys with numpy; they agree with the library's own key()."""
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.lognormal(0, 8, 4_000), np.arange(1, 1001, dtype=float)])
    sketch = QuantileSketch()
    keys = np.ceil(np.log(values) / sketch._log_gamma).astype(np.int64)
    reference = np.array([sketch._mapping.key(v) for v in values.tolist()])
    assert np.abs(keys - reference).max() <= 1 and (keys != reference).mean() < 1e-3
    sketch.add_array(values)
    exact = np.sort(values)
    for rank in (0, 1, 777, 3_000, len(values) - 1):
        assert sketch.value_at_rank(rank) == pytest.approx(exact[rank], rel=ALPHA * (1 + 1e-9))


def test_moments_merge_keeps_precision_for_large_offsets():
    base = 1e9
    values = np.array([base + 1, base + 2, base + 3, base + 4])
    merged = Moments.of(values[:1]).merge(Moments.of(values[1:3])).merge(Moments.of(values[3:]))
    assert merged.std == pytest.approx(float(np.std(values, ddof=1)), rel=1e-9)


def test_csv_matches_data_juicers_own_overall_analysis(tmp_path):
    """Data-Juicer's OverallAnalysis (what dj-analyze runs) on the same rows: same table, same cells,
    quantiles within the stated bound."""
    import io

    from data_juicer.analysis.overall_analysis import OverallAnalysis

    rows = [
        {STATS: {"text_len": n, "lang": lang, "lens": lens, "flag": flag}, "__dj__meta__": {"__dj__tag": tag, "u": 1}}
        for n, lang, lens, flag, tag in [
            (10, "en", [1, 2], True, "a"),
            (20, "zh", [3], False, "b"),
            (30, "en", [], True, "a"),
            (35, "en", [5, 6, 7], True, "c"),
            (None, "fr", [9], False, "a"),
        ]
    ]
    dataset = {STATS: [r[STATS] for r in rows], "__dj__meta__": [r["__dj__meta__"] for r in rows]}
    expected = OverallAnalysis(dataset, str(tmp_path)).analyze(percentiles=[0.9], num_proc=1, skip_export=True)
    expected = pd.read_csv(io.StringIO(expected.to_csv()), index_col=0)
    got = pd.read_csv(io.StringIO(overall_csv(StatsSummary.of_rows(rows), [0.25, 0.5, 0.75, 0.9])), index_col=0)
    assert list(got.columns) == list(expected.columns) == ["text_len", "lang", "lens", "flag", "__dj__tag"]
    assert list(got.index) == list(expected.index)
    quantile_rows = [label for label in got.index if label.endswith("%")]
    exact = got.drop(index=quantile_rows)
    pd.testing.assert_frame_equal(exact, expected.drop(index=quantile_rows), check_exact=False, rtol=1e-12)
    for name, values in (("text_len", [10, 20, 30, 35]), ("lens", [1, 2, 3, 5, 6, 7, 9])):
        for label in quantile_rows:
            _check_quantile(float(got.loc[label, name]), np.array(values, dtype=float), float(label[:-1]) / 100)


@pytest.mark.parametrize(
    "mutate",
    [
        lambda b: b.replace(b'"format":"dj-elastic/stats-summary"', b'"format":"x"'),
        lambda b: b.replace(b'"version":1', b'"version":2'),
        lambda b: b.replace(b'"count":3', b'"count":4'),
        lambda b: b[:-20],
    ],
)
def test_a_corrupt_summary_parses_to_an_error(mutate):
    data = StatsSummary.of_rows({STATS: {"a": n, "b": "x"}} for n in (1, 2, 3)).encode()
    with pytest.raises(JobDirError, match="corrupt stats summary"):
        StatsSummary.parse(mutate(data), "stats.json")
