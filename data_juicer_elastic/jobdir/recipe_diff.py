"""What changed between two shard recipes, said in the recipe's own terms.

A job directory holds one recipe; a run with another one is refused.  The refusal
names the keys that changed, as a user would find them in the YAML::

    process[1] text_length_filter.min_len: 10 -> 20
    process[2] words_num_filter: added
    text_keys: 'text' -> 'content'

Operators are matched by name in order (``difflib``), so inserting one operator
reports that insertion, not a change of every operator after it.
"""

from __future__ import annotations

import difflib
import json
from typing import TYPE_CHECKING, Any, Final

from data_juicer_elastic.errors import clip

if TYPE_CHECKING:
    from data_juicer_elastic.jobdir.records import Manifest

MAX_CHANGES: Final = 8
MAX_VALUE_CHARS: Final = 60
_ABSENT: Final = object()


def recipe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """Every difference, at most ``MAX_CHANGES`` (then "... N more")."""
    changes: list[str] = []
    for key in sorted(set(old) | set(new)):
        if key == "process":
            changes += _process_changes(old.get(key) or [], new.get(key) or [])
        else:
            _value_changes(key, old.get(key, _ABSENT), new.get(key, _ABSENT), changes)
    if len(changes) > MAX_CHANGES:
        changes = changes[:MAX_CHANGES] + [f"... {len(changes) - MAX_CHANGES} more"]
    return changes


def _process_changes(old: list[Any], new: list[Any]) -> list[str]:
    old_ops, new_ops = [_op(item) for item in old], [_op(item) for item in new]
    matcher = difflib.SequenceMatcher(a=[name for name, _ in old_ops], b=[name for name, _ in new_ops], autojunk=False)
    changes: list[str] = []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            for (name, before), position, (_, after) in zip(old_ops[i1:i2], range(j1, j2), new_ops[j1:j2], strict=True):
                _value_changes(f"process[{position}] {name}", before, after, changes)
            continue
        changes += [f"process[{position}] {old_ops[position][0]}: removed" for position in range(i1, i2)]
        changes += [f"process[{position}] {new_ops[position][0]}: added" for position in range(j1, j2)]
    return changes


def _op(item: Any) -> tuple[str, Any]:
    """``{"name": {args}}`` (the shard recipe's form) -> (name, args)."""
    if isinstance(item, dict) and len(item) == 1:
        ((name, args),) = item.items()
        return str(name), args
    return repr(item), None


def _value_changes(path: str, before: Any, after: Any, changes: list[str]) -> None:
    if before == after:
        return
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after), key=str):
            _value_changes(f"{path}.{key}", before.get(key, _ABSENT), after.get(key, _ABSENT), changes)
        return
    changes.append(f"{path}: {_shown(before)} -> {_shown(after)}")


def _shown(value: Any) -> str:
    if value is _ABSENT:
        return "(absent)"
    try:
        text = repr(value) if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    except (TypeError, ValueError):  # not JSON data
        text = repr(value)
    return clip(text, MAX_VALUE_CHARS)


def recipe_differences(
    manifest: Manifest,
    recipe: dict[str, Any],
    rhash: str,
    stage_identities: list[str] | None = None,
    versions: dict[str, str] | None = None,
) -> list[str]:
    """How ``recipe`` (and its operators' identities) differ from the job's, in recipe terms."""
    if manifest.recipe_hash != rhash:
        changes = recipe_changes(manifest.recipe, recipe) or [f"recipe hash {manifest.recipe_hash} -> {rhash}"]
        return ["the recipe changed: " + "; ".join(changes)]
    if stage_identities is None or list(manifest.stage_identities) == list(stage_identities):
        return []
    # Same recipe text, other operator code: a Data-Juicer upgrade or a changed custom operator.
    old, new = list(manifest.stage_identities), list(stage_identities)
    changed = [n.split(":", 1)[-1] for o, n in zip(old, new, strict=False) if o != n] or ["the operator list"]
    before, now = (manifest.versions or {}).get("data_juicer"), (versions or {}).get("data_juicer")
    upgrade = f" (Data-Juicer {before} -> {now})" if before and now and before != now else ""
    return [f"the operators' code changed{upgrade}: {', '.join(changed)} would compute differently"]
