"""The shared-filesystem state machine of an elastic job (no Ray, no Data-Juicer imports).

Modules: ``layout`` (paths), ``identity`` (who a worker is), ``fsio`` (careful file
operations), ``records`` (on-disk records), ``jsonl`` (input policy), ``prepare``,
``splitter``, ``manifest``, ``leases``, ``attempts``, ``tasks``, ``worker_loop``, ``merge``,
``status``, ``retry``, ``verify``.  Import from the modules; nothing is re-exported
here so that importing one piece stays cheap.
"""
