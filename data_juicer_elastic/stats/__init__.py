"""Statistics for analysis: per-shard summaries of Data-Juicer's per-row stats, merged at finalize.

``columns`` (what is summarised, per Data-Juicer's OverallAnalysis), ``moments`` (exact mergeable
count/mean/std/min/max), ``sketch`` (DDSketch quantiles), ``shard_summary`` (the per-shard record), ``shard_hook``
(the shard runner's hook), ``overall`` (finalize: merge, overall.json / overall.csv).  No ray, no data_juicer imports.
"""

from data_juicer_elastic.stats.overall import OverallStats, compute_overall, write_overall_stats
from data_juicer_elastic.stats.shard_summary import StatsSummary, merge_summaries

__all__ = ["OverallStats", "StatsSummary", "compute_overall", "merge_summaries", "write_overall_stats"]
