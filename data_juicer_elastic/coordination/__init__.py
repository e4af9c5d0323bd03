"""Many instances of one submission on one job directory (no Ray, no Data-Juicer imports).

Modules: ``run_id`` (which submission), ``records`` (coordination records),
``elections`` (leaders, heartbeats, the run's one outcome), ``settle`` (abort
watcher, strict-mode waiting), ``flow`` (the whole sequence, steps passed in),
``slots`` (one worker process per slot, GPU subsets), ``stragglers`` (claim gate),
``status`` (read-only view), ``crashpoints`` (test-only fault plans and named crash points).
Import from the modules; nothing is re-exported here.
"""
