"""What became of each of the plugin's patches into Data-Juicer: one :data:`RECORDS` entry per
target (pending, applied, or missing and why), and the one IntegrationError every use of
``elastic_sharded`` raises while a required one is missing (:func:`require_integration`).
``patches`` applies them and records the outcome here; ``dispatch`` and ``dj-elastic doctor``
read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Final, Literal

from data_juicer_elastic import DATA_JUICER_REQUIREMENT
from data_juicer_elastic.compat import dj_config_internals, dj_ops_internals
from data_juicer_elastic.compat.targets import ALREADY, APPLIED
from data_juicer_elastic.errors import IntegrationError
from data_juicer_elastic.integration.config_block import EXECUTOR_TYPE

CONFIG_MODULE: Final = dj_config_internals.CONFIG_MODULE
PROCESS_MODULE: Final = dj_config_internals.PROCESS_MODULE
ANALYZE_MODULE: Final = dj_config_internals.ANALYZE_MODULE
FACTORY_MODULE: Final = dj_ops_internals.FACTORY_MODULE

BUILD_PARSER: Final = f"{CONFIG_MODULE}.build_base_parser"
INIT_SETUP: Final = f"{CONFIG_MODULE}.init_setup_from_cfg"
DISPLAY_CONFIG: Final = f"{CONFIG_MODULE}.display_config"
LOAD_CUSTOM_OPS: Final = f"{CONFIG_MODULE}.load_custom_operators"
PROCESS_MAIN: Final = f"{PROCESS_MODULE}.main"
ANALYZE_MAIN: Final = f"{ANALYZE_MODULE}.main"
CREATE_EXECUTOR: Final = dj_ops_internals.CREATE_EXECUTOR
OP_METACLASS: Final = dj_ops_internals.OP_METACLASS
OP_ERROR_HOOKS: Final = dj_ops_internals.ERROR_HOOKS  # required: without it an operator error drops rows silently
FILE_LISTING: Final = dj_ops_internals.FILE_LISTING

State = Literal["pending", "applied", "missing"]


@dataclass
class PatchRecord:
    target: str
    required: bool  # elastic_sharded is refused while a required patch is missing
    state: State = "pending"
    detail: str = ""


RECORDS: dict[str, PatchRecord] = {
    BUILD_PARSER: PatchRecord(BUILD_PARSER, required=True),
    INIT_SETUP: PatchRecord(INIT_SETUP, required=True),
    DISPLAY_CONFIG: PatchRecord(DISPLAY_CONFIG, required=False),
    LOAD_CUSTOM_OPS: PatchRecord(LOAD_CUSTOM_OPS, required=False),
    PROCESS_MAIN: PatchRecord(PROCESS_MAIN, required=True),
    ANALYZE_MAIN: PatchRecord(ANALYZE_MAIN, required=False),
    CREATE_EXECUTOR: PatchRecord(CREATE_EXECUTOR, required=True),
    OP_METACLASS: PatchRecord(OP_METACLASS, required=False),
    OP_ERROR_HOOKS: PatchRecord(OP_ERROR_HOOKS, required=True),
    FILE_LISTING: PatchRecord(FILE_LISTING, required=False),
}


def mark(target: str, state: State, detail: str = "") -> None:
    record = RECORDS[target]
    # A later "applied" must not hide an earlier problem found for the same target.
    if record.state == "missing" and state == "applied":
        return
    record.state, record.detail = state, detail


def record_install(target: str, outcome: str) -> None:
    """Record what a compat ``wrap_*`` returned: applied, already installed (nothing new), or why not."""
    if outcome == APPLIED:
        mark(target, "applied")
    elif outcome != ALREADY:
        mark(target, "missing", outcome)


def problems() -> list[PatchRecord]:
    return [r for r in RECORDS.values() if r.state == "missing"]


def require_integration() -> None:
    """Raise one IntegrationError if a Data-Juicer internal needed by elastic_sharded is missing."""
    missing = [r for r in problems() if r.required]
    if not missing:
        return
    first, others = missing[0], missing[1:]
    message = (
        f"{first.detail} in Data-Juicer {dj_version() or '(unknown version)'}; "
        f"executor_type {EXECUTOR_TYPE} hooks into it"
    )
    if others:
        message += "; also " + "; ".join(f"{r.target}: {r.detail}" for r in others)
    raise IntegrationError(
        message,
        where=missing[0].target,
        hint=f"install {DATA_JUICER_REQUIREMENT} or a data-juicer-elastic release that supports it; "
        "the built-in executors still work; run `dj-elastic doctor` for details",
    )


def dj_version() -> str | None:
    try:
        return metadata.version("py-data-juicer")
    except metadata.PackageNotFoundError:
        return None
