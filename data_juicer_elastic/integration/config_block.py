"""The recipe's ``elastic:`` block inside Data-Juicer's parser, and back out of a parsed cfg.

Every :class:`~data_juicer_elastic.settings.ElasticSettings` field becomes a typed
``--elastic.<field>`` argument (so ``dj-process --help`` lists them, and jsonargparse types them
from YAML, the command line and ``DJ_PROCESS_ELASTIC__*``); the value rules live in
``ElasticSettings`` alone.  Data-Juicer's setup mutates the parsed cfg (``np`` clamped to this
node's CPUs, node-specific directories, operator attributes), and the shard recipe must not depend
on the node that prepared the job, so a copy of each elastic cfg as parsed is kept
(:func:`remember_parsed` / :func:`parsed_cfg`).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import threading
import typing
import weakref
from typing import Any, Final

from data_juicer_elastic.errors import ConfigError
from data_juicer_elastic.settings import ElasticSettings, closest_key, field_help

EXECUTOR_TYPE: Final = "elastic_sharded"
BLOCK: Final = "elastic"
GROUP_TITLE: Final = "elastic_sharded executor (data-juicer-elastic)"


def cfg_value(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg[key]`` of a parsed cfg (a jsonargparse Namespace or a dict) or of an object's attribute."""
    getter = getattr(cfg, "get", None)
    return getter(key, default) if callable(getter) else getattr(cfg, key, default)


def is_elastic(cfg: Any) -> bool:
    return cfg_value(cfg, "executor_type") == EXECUTOR_TYPE


def require_elastic(cfg: Any, config: str, command: str) -> None:
    """ConfigError unless the parsed recipe asks for elastic_sharded (``dj-elastic prepare`` and
    ``run`` plan and run only such jobs; without it, ``dj-process`` runs Data-Juicer's own executor)."""
    if not is_elastic(cfg):
        raise ConfigError(
            f"the recipe's executor_type is {cfg_value(cfg, 'executor_type')!r}, not {EXECUTOR_TYPE}",
            where=config,
            hint=f"add `executor_type: {EXECUTOR_TYPE}` to the recipe ({command} handles {EXECUTOR_TYPE} jobs only; "
            "dj-process runs the other executors)",
        )


def add_elastic_arguments(parser) -> None:
    """Add ``--elastic.<field>`` for every ElasticSettings field to a jsonargparse parser."""
    hints = typing.get_type_hints(ElasticSettings)
    docs = field_help()
    group = parser.add_argument_group(
        GROUP_TITLE,
        description=f"Used when executor_type is {EXECUTOR_TYPE}; ignored by the built-in executors.",
    )
    for field in dataclasses.fields(ElasticSettings):
        hint, default = hints[field.name], field.default
        if default is dataclasses.MISSING:
            # Required only for elastic_sharded: settings_from_cfg says so by name;
            # a parser-level "required" would break every built-in recipe.
            hint, default = hint | None, None
        group.add_argument(f"--{BLOCK}.{field.name}", type=hint, default=default, help=docs.get(field.name, ""))


_ELASTIC_NAME: Final = re.compile(rf"\b{BLOCK}\.([A-Za-z_][A-Za-z0-9_]*)")


# jsonargparse names types by their repr: "Expected a <class 'int'>"; "NoneType" is YAML's null
_TYPE_REPR: Final = re.compile(r"(?:\ban? )?<class '(?:[\w.]+\.)?(\w+)'>")


def amend_parse_error(message: str) -> str:
    """A parse error of Data-Juicer's parser as a user reads it: types named as in a recipe
    (``int``, not ``<class 'int'>``) and "did you mean" for a mistyped ``elastic.*`` key."""
    return hint_unknown_keys(plain_type_names(message))


def plain_type_names(message: str) -> str:
    """``a <class 'int'>`` -> ``int``, ``<class 'NoneType'>`` -> ``null``."""
    return _TYPE_REPR.sub(lambda match: "null" if match.group(1) == "NoneType" else match.group(1), message)


def hint_unknown_keys(message: str) -> str:
    """A parse error of Data-Juicer's parser, with "did you mean" for each unknown ``elastic.*``
    key it names (``Option 'elastic.num_shard' is not accepted``, ``unrecognized arguments:
    --elastic.numshards 4``)."""
    known = set(ElasticSettings.field_names())
    guesses = {}
    for name in _ELASTIC_NAME.findall(message):
        if name not in known and name not in guesses and (guess := closest_key(name)):
            guesses[name] = guess
    if not guesses:
        return message
    meant = ", ".join(f"{BLOCK}.{guess}" for guess in guesses.values())
    return f"{message}: did you mean {meant}? (`dj-process --help` lists every {BLOCK}.* key)"


def given_block(cfg: Any) -> list[str]:
    """The ``elastic.*`` keys a parsed cfg sets to other than their defaults (``job_dir`` set at all):
    a recipe that has an ``elastic:`` block, or ``--elastic.*`` options."""
    values = _block_values(cfg)
    if values is None:
        return []
    defaults = {f.name: f.default for f in dataclasses.fields(ElasticSettings)}
    return [
        f"{BLOCK}.{name}"
        for name, value in values.items()
        if name in defaults and value is not None and (defaults[name] is dataclasses.MISSING or value != defaults[name])
    ]


def _block_values(cfg: Any) -> dict[str, Any] | None:
    block = cfg_value(cfg, BLOCK)
    return None if block is None else block.as_dict() if hasattr(block, "as_dict") else dict(block)


def settings_from_cfg(cfg: Any) -> ElasticSettings:
    """The validated ``elastic:`` block of a parsed cfg; ConfigError naming the field
    (``elastic.num_shards``...) for a bad or missing value."""
    values = _block_values(cfg)
    if values is None:
        raise ConfigError(
            "the recipe has no elastic: block",
            where=BLOCK,
            hint="add `elastic: {job_dir: /shared/jobs/<name>}`; "
            "if it is there, the plugin's parser patch did not run (see `dj-elastic doctor`)",
        )
    return ElasticSettings.from_mapping(values)


_parsed_lock = threading.RLock()  # weakref callbacks may run during GC inside the lock
_parsed: dict[int, tuple[weakref.ref, Any]] = {}


def remember_parsed(cfg: Any) -> None:
    """Keep a deep copy of ``cfg`` as parsed; found again by :func:`parsed_cfg` for the same object."""
    _store(cfg, copy.deepcopy(cfg))


def _store(cfg: Any, snapshot: Any) -> None:
    key = id(cfg)

    def forget(ref, key=key):
        with _parsed_lock:
            entry = _parsed.get(key)
            if entry is not None and entry[0] is ref:
                del _parsed[key]

    with _parsed_lock:
        _parsed[key] = (weakref.ref(cfg, forget), snapshot)


def parsed_cfg(cfg: Any) -> Any | None:
    """The copy kept by :func:`remember_parsed` for this very cfg object, or None."""
    with _parsed_lock:
        entry = _parsed.get(id(cfg))
    if entry is None or entry[0]() is not cfg:
        return None
    return entry[1]


def alias_parsed(new: Any, old: Any) -> None:
    """Make the copy kept for ``old`` findable from ``new`` too (a setup step returned a new object;
    for the same object, nothing changes)."""
    snapshot = parsed_cfg(old)
    if snapshot is not None:
        _store(new, snapshot)
