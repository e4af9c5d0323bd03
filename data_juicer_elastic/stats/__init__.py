"""Statistics for analysis: per-shard summaries of Data-Juicer's per-row stats, merged at finalize.
No ray, no data_juicer imports.
"""

from data_juicer_elastic.stats.overall import OverallStats, compute_overall, write_overall_stats
from data_juicer_elastic.stats.shard_summary import StatsSummary, merge_summaries

__all__ = ["OverallStats", "StatsSummary", "compute_overall", "merge_summaries", "write_overall_stats"]
