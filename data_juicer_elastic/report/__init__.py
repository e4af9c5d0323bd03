"""``dj-elastic report``: one self-contained HTML file about a job (running, failed or finished).

* :mod:`.facts`    - read the job directory (read-only) into shard and trace facts
* :mod:`.attempt_facts` - how each attempt started and ended (``AttemptFact``, ``AttemptOutcome``)
* :mod:`.series`   - pure derivations: time window, throughput bins, node summaries, lanes
* :mod:`.svg`      - inline-SVG building blocks
* :mod:`.timeline` - the per-node Gantt chart of attempts (aggregated for very large jobs)
* :mod:`.charts`   - throughput, progress, size vs duration, adaptive-batching size traces
* :mod:`.render`   - the page

Imports neither Ray, torch nor Data-Juicer.
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.report.facts import JobFacts, gather
from data_juicer_elastic.report.render import page
from data_juicer_elastic.report.timeline import MAX_BARS

__all__ = ["ReportResult", "gather", "write_report"]


@dataclass(frozen=True)
class ReportResult:
    output: Path
    bytes: int
    shards: int
    attempts: int
    aggregated: bool  # the timeline shows activity strips instead of one bar per attempt
    facts: JobFacts


def write_report(job_dir: str | Path, output: str | Path, now: float | None = None) -> ReportResult:
    """Write the report of ``job_dir`` to ``output`` (replaced atomically); the job is only read."""
    job = Path(os.path.abspath(job_dir))
    target = Path(os.path.abspath(output))
    if target == job or job in target.parents:
        raise ConfigError(
            f"the report {target} would be written inside the job directory {job}",
            where="--output",
            hint="write the report elsewhere: dj-elastic report never changes the job directory",
        )
    facts = gather(job, now=now)
    data = page(facts).encode("utf-8")
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.parent / f".{target.name}.{secrets.token_hex(6)}.tmp"
    # 0o666 minus the umask, like any file the user writes (mkstemp's 0600 would hide a report meant to be shared)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)  # a reader never sees half a report
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return ReportResult(
        target, len(data), len(facts.shards), len(facts.attempts), len(facts.attempts) > MAX_BARS, facts
    )
