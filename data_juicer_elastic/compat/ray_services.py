"""Ray 2.60: what ``ray.init("auto")`` would connect to, asked without connecting
(``ray._private.services.canonicalize_bootstrap_address``, its cache ``find_gcs_addresses`` cleared
first): ``ray_address: auto`` with no runtime on the node fails fast (``execution.ray_runtime``).
"""

from __future__ import annotations

from typing import Final

from data_juicer_elastic.compat import import_target, ray_moved

MODULE: Final = "ray._private.services"
TARGETS: Final = ("canonicalize_bootstrap_address", "find_gcs_addresses")


def canonical_address(address: str) -> str | None:
    """The bootstrap address ``address`` (``"auto"``) resolves to; ConnectionError when no runtime
    runs; None when Ray's internals moved (the caller then lets ``ray.init`` tell)."""
    try:
        from ray._private import services
    except ImportError:  # pragma: no cover - Ray moved it
        return None
    try:
        services.find_gcs_addresses.cache_clear()
        return services.canonicalize_bootstrap_address(address)
    except AttributeError:  # pragma: no cover - Ray internals moved
        return None


def self_check() -> str:
    services = import_target(MODULE, where="ray")
    missing = [name for name in TARGETS if not callable(getattr(services, name, None))]
    if missing or not callable(getattr(services.find_gcs_addresses, "cache_clear", None)):
        raise ray_moved(f"{MODULE}: {', '.join(missing) or 'find_gcs_addresses.cache_clear'} missing", where=MODULE)
    return f"{MODULE}: {', '.join(TARGETS)} found"
