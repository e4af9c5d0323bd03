"""Checks every delivered row against the reference and prints the contenders side by side."""

from __future__ import annotations

import statistics
from typing import Any

TOLERANCE = 1e-3  # max abs difference of a (normalised) embedding from the small-batch reference


def summarize(outcome, encoder, reference: dict[int, list[float]], capacity: float | None = None) -> dict[str, Any]:
    """One contender's numbers; ``reference``: row id -> expected embedding."""
    ids = outcome.ids
    seen: set[int] = set()
    duplicated = reordered = changed = 0
    worst = 0.0
    for position, (row, got) in enumerate(zip(ids, outcome.embeddings, strict=True)):
        if row in seen:
            duplicated += 1
            continue
        seen.add(row)
        reordered += position > 0 and row < ids[position - 1]
        diff = max((abs(a - b) for a, b in zip(got, reference[row], strict=True)), default=0.0)
        worst = max(worst, diff)
        changed += diff > TOLERANCE
    sizes = outcome.sizes or [0]
    peak = getattr(encoder, "peak_bytes", 0.0)
    return {
        "name": outcome.name,
        "rows_in": outcome.rows_in,
        "rows_out": len(seen),
        "secs": outcome.secs,
        "ooms": outcome.ooms,
        "retries": outcome.retries,
        "calls": outcome.calls,
        "sizes": sizes,
        "lost": outcome.rows_in - len(seen),
        "duplicated": duplicated,
        "reordered": reordered,
        "changed": changed,
        "max_diff": worst,
        "busy_secs": encoder.busy_secs,
        "padded_tokens": encoder.padded_tokens,
        "real_tokens": encoder.real_tokens,
        "peak": peak / capacity if capacity else peak,
        "failed": outcome.failed,
        "note": outcome.note,
    }


def pool(per_seed: list[list[dict]]) -> list[dict]:
    """Sum the seeds' counts per contender (rates are then total rows / total seconds)."""
    pooled: dict[str, dict] = {}
    for results in per_seed:
        for r in results:
            key = r["name"].split(" (")[0]
            if key not in pooled:
                pooled[key] = {**r, "sizes": list(r["sizes"]), "failed": [r["failed"]] if r["failed"] else []}
                continue
            p = pooled[key]
            for k in (
                "rows_in",
                "rows_out",
                "secs",
                "ooms",
                "retries",
                "calls",
                "lost",
                "duplicated",
                "reordered",
                "changed",
                "busy_secs",
                "padded_tokens",
                "real_tokens",
            ):
                p[k] += r[k]
            p["sizes"] += r["sizes"]
            p["max_diff"], p["peak"] = max(p["max_diff"], r["max_diff"]), max(p["peak"], r["peak"])
            p["failed"] += [r["failed"]] if r["failed"] else []
    for p in pooled.values():
        if not isinstance(p["failed"], list):
            p["failed"] = [p["failed"]] if p["failed"] else []
    return list(pooled.values())


def print_table(results: list[dict], peak_unit: str = "of capacity") -> bool:
    """Markdown table; True when no ``ours-*`` contender lost, duplicated, reordered or changed a row."""
    base = next((r for r in results if r["name"].startswith("data-juicer")), None)
    base_rate = base["rows_out"] / base["secs"] if base and base["secs"] else None
    print(
        "| contender | rows/s | vs DJ | rows out / in | OOMs | retries | calls | micro-batch rows min/median/max "
        f"| padding eff. | busy | peak ({peak_unit}) | lost/dup/reordered/changed | max diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|---:|")
    ok = True
    for r in results:
        rate = r["rows_out"] / r["secs"] if r["secs"] else 0.0
        sizes = r["sizes"]
        silent = (r["lost"] - (r["rows_in"] - r["rows_out"]), r["duplicated"], r["reordered"], r["changed"])
        bad = r["lost"] or any(silent[1:])
        if r["name"].startswith("ours") and bad:
            ok = False
        peak = f"{r['peak']:.2f}" if peak_unit == "of capacity" else f"{r['peak'] / 2**20:,.0f} MiB"
        eff = r["real_tokens"] / r["padded_tokens"] if r["padded_tokens"] else 0.0
        print(
            f"| {r['name']} | {rate:,.0f} | {rate / base_rate if base_rate else 0:.2f}x | {r['rows_out']:,} / "
            f"{r['rows_in']:,} | {r['ooms']} | {r['retries']} | {r['calls']} | {min(sizes)}/"
            f"{statistics.median(sizes):g}/{max(sizes)} | {eff:.2f} | {r['busy_secs'] / max(r['secs'], 1e-9):.2f} | "
            f"{peak} | {r['lost']}/{r['duplicated']}/{r['reordered']}/{r['changed']} | {r['max_diff']:.1e} |"
        )
    for r in results:
        for why in r["failed"] if isinstance(r["failed"], list) else [r["failed"]] if r["failed"] else []:
            print(f"- {r['name']}: job FAILED ({why})")
        if r["note"]:
            print(f"- {r['name']}: {r['note']}")
    return ok
