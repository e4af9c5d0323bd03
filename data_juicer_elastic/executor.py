"""ElasticShardedExecutor: what ``dj-process`` runs for ``executor_type: elastic_sharded`` (one
instance's run: ``job_run.JobRun``, docs/architecture.md and docs/multinode.md).  This module loads
Data-Juicer (its executor base class); the node's worker is ``local_worker``, which does not.
"""

from __future__ import annotations

from typing import Any

from data_juicer_elastic.compat.targets import dj_moved
from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.integration.config_block import settings_from_cfg
from data_juicer_elastic.integration.recipe import check_export
from data_juicer_elastic.job_run import JobRun
from data_juicer_elastic.shards.merge import MergeResult

try:  # Data-Juicer's base class (exported by data_juicer.core.executor), so ExecutorFactory users get a real executor
    from data_juicer.core.executor import ExecutorBase
except ImportError as exc:  # pragma: no cover - only when Data-Juicer moved it
    raise dj_moved("data_juicer.core.executor.ExecutorBase is missing") from exc


class ElasticShardedExecutor(ExecutorBase):
    """Run a Data-Juicer recipe through shared-storage shards and node-local Ray."""

    def __init__(self, cfg: Any = None):
        if cfg is None:
            from data_juicer.config import init_configs

            cfg = init_configs()
        self.cfg = cfg
        self.executor_type = "elastic_sharded"
        self.settings = settings_from_cfg(cfg)

    def run(self, load_data_np: Any = None, skip_return: bool = False) -> MergeResult | None:
        if not getattr(self.cfg, "export_path", None):
            raise ConfigError("export_path is not set", where="recipe", hint="set export_path to the merged .jsonl")
        check_export(
            str(self.cfg.export_path),
            self.cfg.get("export_type"),
            self.cfg.get("export_shard_size"),
            self.settings.export_layout,
        )
        return JobRun(self.cfg, self.settings).run()
