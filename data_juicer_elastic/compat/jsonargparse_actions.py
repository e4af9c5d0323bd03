"""jsonargparse: a built parser's ``ArgumentParser._actions`` (``--executor_type`` is changed in place
to accept ``elastic_sharded``), the ``<lambda>`` converter it makes for a ``type`` given with
``choices`` (closure cell ``typehint``; ``--help`` would print its repr as the type), and
``ArgumentParser.error(message, ex)``, replaced on one parser to add "did you mean" for an
unknown ``elastic.*`` key.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from data_juicer_elastic.errors import IntegrationError

TARGET: Final = "jsonargparse.ArgumentParser._actions"


def actions(parser: Any) -> list[Any]:
    return list(getattr(parser, "_actions", ()))


def action_for(parser: Any, dest: str) -> Any:
    """The parser's action storing ``dest``, or None."""
    return next((a for a in actions(parser) if getattr(a, "dest", None) == dest), None)


def dests_starting(parser: Any, prefix: str) -> list[str]:
    return sorted(a.dest for a in actions(parser) if getattr(a, "dest", "").startswith(prefix))


def name_converter(action: Any) -> None:
    """Help text only: show the converter jsonargparse made for ``type`` with ``choices`` as that type."""
    convert = getattr(action, "type", None)
    code = getattr(convert, "__code__", None)
    if code is None or getattr(convert, "__name__", "") != "<lambda>" or "typehint" not in code.co_freevars:
        return
    typehint = convert.__closure__[code.co_freevars.index("typehint")].cell_contents
    action.type = NamedType(convert, getattr(typehint, "__name__", None) or str(typehint))


def amend_errors(parser: Any, amend: Callable[[str], str]) -> None:
    """Parse errors of this ``parser`` object show ``amend(message)``; jsonargparse still prints
    and exits (status 2) as it does.  Idempotent."""
    original = getattr(parser, "error", None)
    if not callable(original) or getattr(original, "_dj_elastic_amend", None) is amend:
        return

    def error(message: str, *args: Any, **kwargs: Any) -> Any:
        return original(amend(message) if isinstance(message, str) else message, *args, **kwargs)

    error._dj_elastic_amend = amend  # type: ignore[attr-defined]
    parser.error = error


class NamedType:
    """A converter that converts exactly as the one it wraps and shows as the type it converts to."""

    def __init__(self, convert, name: str):
        self.convert, self.name = convert, name

    def __call__(self, value):
        return self.convert(value)

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__


def self_check() -> str:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_argument("--kind", type=str, choices=["a", "b"], default="a")
    action = action_for(parser, "kind")
    if action is None or list(action.choices) != ["a", "b"]:
        raise IntegrationError(f"{TARGET}: a built parser's actions are no longer listed there", where=TARGET)
    name_converter(action)
    if not isinstance(action.type, NamedType) or str(action.type) != "str":
        raise IntegrationError(f"{TARGET}: the choices converter no longer closes over typehint", where=TARGET)
    amend_errors(parser, lambda message: f"{message} [amended]")
    parser.exit_on_error = False  # raise the error instead of printing it and exiting
    amended = False
    try:
        parser.parse_args(["--kind", "c"])
    except Exception as exc:  # noqa: BLE001 - jsonargparse's ArgumentError
        amended = "[amended]" in str(exc)
    if not amended:
        raise IntegrationError(f"{TARGET}: parse errors no longer pass ArgumentParser.error(message)", where=TARGET)
    return f"{TARGET}, the choices converter's typehint and ArgumentParser.error found"
