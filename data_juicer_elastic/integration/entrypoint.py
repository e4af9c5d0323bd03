"""Entry point (group ``data_juicer.ops``): installs the deferred Data-Juicer patches.  Data-Juicer
imports it while its config module is only partly executed, so nothing here imports Data-Juicer's
config or core (``compat.importlib_deferred`` applies each patch once its module has finished).
"""

from data_juicer_elastic.console.quiet import quiet_from_start, quiet_ray_worker
from data_juicer_elastic.integration import patches
from data_juicer_elastic.integration.dispatch import driving_elastic

patches.install()
quiet_ray_worker()  # a no-op but in the Ray workers of a quiet elastic job
quiet_from_start(driving_elastic())  # dj-process of an elastic recipe: Data-Juicer's first lines filtered too
