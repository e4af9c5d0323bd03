"""``dj-analyze`` never overwrites the files an elastic job published beside its export.

Data-Juicer's Analyzer writes the stats it computes to ``<export_path>_stats.jsonl`` (its
``Exporter``'s name for it) and, with ``export_original_dataset``, the data to ``export_path``.
Run on an elastic job's export with the job's own recipe (``dj-analyze --config <elastic recipe>
--dataset_path <its export>``), or with a recipe whose ``export_path`` is that export, the first
is the job's row stats file: replaced silently, it would no longer be the one the merge published
(merge.json records its sha256, which ``dj-elastic verify`` checks).  So such a run is refused,
before Data-Juicer's set-up writes anything, with one ConfigError naming the file and an
``--export_path`` to use instead (docs/analysis.md).

A file is the job's when the job's merge.json names it (a recipe with ``executor_type:
elastic_sharded`` names the job directory), or when it lies beside an export that finalize
marked as elastic (``<export>_overall_stats.json``, "dj-elastic/overall-stats", or the streaming
merge's ``<export>.progress.json``): any recipe may point there.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from data_juicer_elastic.errors import ConfigError, ElasticError
from data_juicer_elastic.integration.config_block import cfg_value, is_elastic, settings_from_cfg
from data_juicer_elastic.jobdir.exports import MergeRecord, export_side_path, export_target
from data_juicer_elastic.jobdir.layout import JobLayout
from data_juicer_elastic.shards.merge import progress_path

# stats.overall.FORMAT (not imported: that module loads the merge and the sketches)
OVERALL_STATS_FORMAT = "dj-elastic/overall-stats"


def analyzer_targets(cfg: Any) -> list[Path]:
    """The local files Data-Juicer's Analyzer writes for ``cfg``: the stats file, and the data
    itself with ``export_original_dataset`` (named as ``data_juicer.core.exporter.Exporter`` does)."""
    export = cfg_value(cfg, "export_path")
    if not export or "://" in str(export):
        return []
    export = str(export)
    suffix = cfg_value(cfg, "export_type") or export.rsplit(".", 1)[-1].lower()
    targets = [export.replace("." + str(suffix), "_stats.jsonl")]
    if cfg_value(cfg, "export_original_dataset"):
        targets.append(export)
    return [export_target(target) for target in targets]


def refuse_overwrites(cfg: Any) -> None:
    """ConfigError when the Analyzer would write over a file an elastic job published."""
    for target in analyzer_targets(cfg):
        if not os.path.lexists(target):
            continue
        owner = _published_by(cfg, target)
        if owner is None:
            continue
        export = export_target(str(cfg_value(cfg, "export_path")))
        instead = export.parent / "analysis" / export.name
        raise ConfigError(
            f"dj-analyze would overwrite {target}, which {owner}; the analysis writes its stats beside "
            "its export_path, and the job's own file would be lost",
            where="export_path",
            hint=f"give the analysis another export_path, e.g. `--export_path {instead}`: dj-analyze writes only "
            f"{export_side_path(instead, '_stats.jsonl').name} there, never the data",
        )


def _published_by(cfg: Any, target: Path) -> str | None:
    """Which elastic job published ``target`` (words for the error), or None."""
    if is_elastic(cfg):
        try:
            job_dir = Path(os.path.abspath(os.path.expanduser(settings_from_cfg(cfg).job_dir)))
            record = MergeRecord.read(JobLayout(job_dir).merge_record)
        except ElasticError:
            record = None  # a corrupt record or block: the markers below still decide
        if record is not None:
            named = {record.output_path: "merged output", record.row_stats_path: "row stats"}
            named[record.errors_path] = "quarantine file"
            for path, what in named.items():
                if path and _same(Path(path), target):
                    return f"is the {what} the elastic job {job_dir} published (its merge.json names it)"
    export = export_target(str(cfg_value(cfg, "export_path")))
    marker = _elastic_marker(export)
    if marker is not None:
        return f"an elastic job published beside its export {export} ({marker.name} says so)"
    return None


def _elastic_marker(export: Path) -> Path | None:
    """The file finalize or the streaming merge wrote beside an elastic export, if there is one."""
    overall = export_side_path(export, "_overall_stats.json")
    try:
        with open(overall, encoding="utf-8") as handle:
            if json.load(handle).get("format") == OVERALL_STATS_FORMAT:
                return overall
    except (OSError, ValueError, AttributeError):
        pass

    progress = progress_path(export)
    return progress if progress.is_file() else None


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.abspath(a) == os.path.abspath(b)
