"""The pure controller, driven by synthetic OOM traces on a fake clock."""

from __future__ import annotations

import math
import random

import pytest

from data_juicer_elastic.batching.policy import Action, BatchPolicy, PolicyConfig


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def drive(policy: BatchPolicy, capacity, rows_total: int, outer: int, costs=None, clock: Clock | None = None):
    """Run outer batches through the policy against ``capacity(call)``; return the (rows, cost, ok) trace."""
    trace = []
    calls = 0
    for start in range(0, rows_total, outer):
        n_outer = min(outer, rows_total - start)
        offset = 0
        while offset < n_outer:
            policy.begin_slice()
            row_costs = [1.0] * n_outer if costs is None else costs[start : start + n_outer]
            while True:
                remaining = n_outer - offset

                def prefix(n, o=offset, rc=row_costs):
                    return float(sum(rc[o : o + n]))

                rows = policy.choose_rows(remaining, prefix)
                cost = prefix(rows)
                calls += 1
                if clock is not None:
                    clock.now += 1
                if cost > capacity(calls):
                    trace.append((rows, cost, False))
                    decision = policy.on_oom(rows, cost)
                    if decision.action is Action.FAIL:
                        raise RuntimeError("terminal")
                    continue
                trace.append((rows, cost, True))
                bound = rows < remaining and prefix(rows + 1) > policy.budget
                policy.on_success(rows, cost, budget_bound=bound)
                offset += rows
                break
    return trace


def test_bounds_never_exceed_ceiling_and_at_least_one_row():
    policy = BatchPolicy(64)
    assert policy.choose_rows(1000) == 64  # the ceiling (batch_size) bounds every slice
    assert policy.choose_rows(5) == 5
    assert policy.choose_rows(0) == 0
    policy.on_oom(64, 64)
    policy.begin_slice()
    assert 1 <= policy.choose_rows(64) < 64
    policy.budget = 0.5  # even a budget below one row's cost gives one row
    assert policy.choose_rows(10, lambda n: 100.0 * n) == 1


def test_first_oom_shrinks_to_half_and_never_repeats_the_failing_size():
    policy = BatchPolicy(100)
    assert policy.on_oom(100, 100).action is Action.RETRY
    policy_rows = policy.choose_rows(100)
    assert policy_rows == 50
    trace = drive(BatchPolicy(100), lambda _: 37, 2000, 100)
    failing = {rows for rows, _, ok in trace if not ok}
    # after a size failed, no later slice at that size or above (no drift in this trace)
    for i, (rows, _, _ok) in enumerate(trace):
        earlier = [r for r, _, good in trace[:i] if not good]
        if earlier:
            assert rows < min(earlier), (i, rows, earlier)
    assert all(r <= 37 for r, _, ok in trace[-50:] if ok)
    assert failing  # it did have to learn


def test_converges_below_capacity_with_few_ooms():
    policy = BatchPolicy(512)
    trace = drive(policy, lambda _: 40, 20_000, 512)
    ooms = sum(1 for _, _, ok in trace if not ok)
    assert ooms <= 8
    assert 36 <= policy.budget <= 40  # within 10% of the capacity (min_gap 5% + integer rounding)
    assert max(rows for rows, _, ok in trace[-100:] if ok) <= 40


def test_growth_is_cautious_below_a_known_failing_size():
    policy = BatchPolicy(1000, PolicyConfig(successes_before_growth=1))
    policy.on_oom(400, 400)  # failing = 400, budget = 200
    sizes = []
    for _ in range(20):
        policy.begin_slice()
        rows = policy.choose_rows(1000)
        sizes.append(rows)
        policy.on_success(rows, rows, budget_bound=True)
    assert sizes == sorted(sizes)
    assert max(sizes) < 400 * (1 - policy.config.min_gap) + 1
    assert sizes[1] - sizes[0] > sizes[-1] - sizes[-2]  # steps shrink as the gap closes


def test_growth_without_a_failing_size_is_multiplicative_and_only_when_budget_bound():
    policy = BatchPolicy(10_000, PolicyConfig(successes_before_growth=1, growth=1.5))
    policy.seed(safe=100, failing=None)
    policy.on_success(100, 100, budget_bound=False)  # the end of an outer batch: no evidence
    assert policy.budget == 100
    policy.on_success(100, 100, budget_bound=True)
    assert policy.budget == pytest.approx(150)


def test_retry_budget_reaches_the_floor_before_failing():
    """Every call fails: the slice shrinks to one row, waits floor_retries times, then FAIL, within budget."""
    for ceiling in (1, 2, 7, 64, 512, 1000):
        policy = BatchPolicy(ceiling)
        policy.begin_slice()
        seen, ooms, waits = [], 0, 0
        while True:
            rows = policy.choose_rows(ceiling)
            seen.append(rows)
            ooms += 1
            decision = policy.on_oom(rows, rows)
            if decision.action is Action.WAIT:
                waits += 1
                assert decision.wait_secs == policy.config.floor_backoff_secs * waits
            if decision.action is Action.FAIL:
                break
            assert ooms <= policy.slice_oom_budget
        assert seen[-1] == 1 and waits == policy.config.floor_retries
        assert ooms <= policy.slice_oom_budget
        assert all(b <= a for a, b in zip(seen, seen[1:], strict=False))
        assert ooms <= 2 + math.ceil(math.log2(ceiling)) + policy.config.floor_retries + 1


def test_floor_success_after_a_wait_recovers():
    policy = BatchPolicy(4)
    policy.begin_slice()
    for rows in (4, 2, 1):
        assert policy.choose_rows(4) == rows
        policy.on_oom(rows, rows)
    assert policy.choose_rows(4) == 1  # the waits retry the same single row
    policy.on_success(1, 1, budget_bound=False)
    policy.begin_slice()
    assert policy.choose_rows(4) >= 1


def test_drift_oom_retries_same_size_once_then_shrinks():
    policy = BatchPolicy(100)
    policy.seed(safe=50, failing=None)
    policy.begin_slice()
    policy.on_success(50, 50, budget_bound=True)
    policy.begin_slice()
    first = policy.on_oom(50, 50)  # 50 succeeded before: fragmentation or a transient neighbour?
    assert first.same_size and policy.choose_rows(100) == 50
    second = policy.on_oom(50, 50)  # not cured by cleanup: it is capacity; shrink, forget proven sizes
    assert not second.same_size and policy.choose_rows(100) <= 25
    assert policy.safe is None and policy.failing == 50


def test_fragmentation_tests_stop_when_they_keep_failing():
    policy = BatchPolicy(100)
    policy.seed(safe=60, failing=None)
    misses = 0
    for _ in range(6):
        policy.begin_slice()
        policy.on_success(40, 40, budget_bound=False)
        policy.safe = 60
        policy.begin_slice()
        decision = policy.on_oom(50, 50)
        if decision.same_size:
            policy.on_oom(50, 50)
            misses += 1
    assert misses == 1  # after one miss (hits 0 < misses 1) no more same-size tests


def test_reprobe_after_successes_and_backoff_after_a_failed_reprobe():
    clock = Clock()
    config = PolicyConfig(reprobe_successes=10, reprobe_secs=1e9, successes_before_growth=1)
    policy = BatchPolicy(1000, config, clock=clock)
    policy.on_oom(100, 100)
    for _ in range(10):
        policy.begin_slice()
        policy.on_success(50, 50, budget_bound=True)
    assert policy.failing is None and policy.reprobes == 1  # expired: growth may pass 100 again
    policy.begin_slice()
    policy.on_oom(110, 110)  # the re-probe failed: the old bound is back, twice as long until the next one
    for _ in range(10):
        policy.begin_slice()
        policy.on_success(50, 50, budget_bound=False)
    assert policy.failing == 100
    for _ in range(10):
        policy.begin_slice()
        policy.on_success(50, 50, budget_bound=False)
    assert policy.failing is None and policy.reprobes == 2


def test_reprobe_after_time_on_the_injected_clock():
    clock = Clock()
    policy = BatchPolicy(1000, PolicyConfig(reprobe_secs=30), clock=clock)
    policy.on_oom(100, 100)
    policy.begin_slice()
    policy.on_success(10, 10, budget_bound=False)
    assert policy.failing == 100
    clock.now = 31
    policy.on_success(10, 10, budget_bound=False)
    assert policy.failing is None


def test_step_down_and_up_is_tracked():
    clock = Clock()

    def capacity(call):
        return 60 if 300 <= call < 700 else 100

    trace = drive(BatchPolicy(512, clock=clock), capacity, 60_000, 512, clock=clock)
    during = [rows for rows, _, ok in trace[400:650] if ok]
    assert max(during) <= 60
    assert sum(1 for _, _, ok in trace if not ok) < 60


def test_cost_budget_with_variable_row_costs():
    rng = random.Random(1)
    costs = [rng.choice([1, 2, 3, 50]) for _ in range(5000)]
    trace = drive(BatchPolicy(256), lambda _: 200, 5000, 256, costs=costs)
    assert sum(1 for _, _, ok in trace if not ok) <= 10
    assert all(cost <= 200 for _, cost, ok in trace[-100:] if ok)


def test_state_is_bounded_and_json_safe():
    policy = BatchPolicy(512, PolicyConfig(trace_len=8))
    drive(policy, lambda _: 40, 5000, 512)
    assert len(policy.trace) == 8
    state = policy.state()
    assert all(v is None or isinstance(v, (int, float)) and v != math.inf for v in state.values())


def test_seed_and_validation():
    policy = BatchPolicy(64)
    policy.seed(safe=20, failing=30)
    assert policy.choose_rows(64) == 20 and policy.failing == 30
    policy.on_success(20, 20, budget_bound=True)
    with pytest.raises(RuntimeError):
        policy.seed(safe=1, failing=None)
    with pytest.raises(ValueError):
        BatchPolicy(0)
    with pytest.raises(ValueError):
        PolicyConfig(growth=1.0)
