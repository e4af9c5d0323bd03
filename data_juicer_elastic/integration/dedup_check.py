"""The deduplicators an elastic recipe may hold, and the arguments each stage runs with.

``dedup.stages.ACCEPTED`` names the operators deduplicated across shards: Data-Juicer's three text
deduplicators, and two Ray versions run with the matching default operator's semantics (the rows kept
are those the default executor keeps; the Ray versions keep whichever copy their batches reach first,
and the first copy is one of the results they allow).  A Ray version's arguments shared with the default
operator are kept, its Ray-only tuning keys dropped with one warning line; both sets come from the
classes' ``__init__`` signatures, so they follow Data-Juicer.

Refused, naming the supported alternative: variants that hash differently (the C++ BTS MinHash, the GPU
MinHash of ``accelerator: cuda``) and every other deduplicator.  An accepted deduplicator is built here
once with its arguments, as Data-Juicer builds it, and hashes one sample row: a config Data-Juicer would
refuse (a bad type or value, an unknown tokenization) is refused before anything is written.
"""

from __future__ import annotations

import importlib.util
import inspect
from functools import cache
from typing import Any, Final

from data_juicer_elastic.dedup.stages import ACCEPTED, DedupStage, dedup_stages
from data_juicer_elastic.errors import RecipeError

_DJ_DEDUP_PACKAGE: Final = "data_juicer.ops.deduplicator."
_SAMPLE_TEXT: Final = "The quick brown fox jumps over the lazy dog, then naps in the warm afternoon sun."

_SUPPORTED: Final = "document_deduplicator, document_minhash_deduplicator, document_simhash_deduplicator"
_DIFFERENT_HASHES: Final = {
    "ray_bts_minhash_cpp_deduplicator": (
        "it computes MinHash with its own C++ code, so its near-copy groups differ from Data-Juicer's default "
        "operator's",
        "use document_minhash_deduplicator or ray_bts_minhash_deduplicator with the same arguments",
    ),
}
_WITH_UID: Final = (
    "it keeps rows by a __dj__uid column the input must carry, not by input order",
    "use {base} (it keeps the first row of each group in input order)",
)
_OTHER_WHY: Final = (
    "it is not one of the deduplicators elastic_sharded runs across shards ({supported}, and the Ray versions "
    "ray_document_deduplicator and ray_bts_minhash_deduplicator)"
)
_OTHER_DO: Final = (
    "run it in a separate Data-Juicer job on the merged output (e.g. `dj-process --config dedup.yaml "
    "--dataset_path <export_path>`)"
)


def is_deduplicator(op_class: type, kind: str | None) -> bool:
    """A Deduplicator, or one of Data-Juicer's deduplicators built as another kind (the Ray exact
    deduplicators are Filters)."""
    return kind == "Deduplicator" or any(k.__module__.startswith(_DJ_DEDUP_PACKAGE) for k in op_class.__mro__)


def check_deduplicator(position: int, name: str, op_class: type, args: dict[str, Any]) -> str | None:
    """Refuse a deduplicator elastic_sharded cannot run as Data-Juicer's default executor would, or a
    config Data-Juicer would refuse (RecipeError naming ``process[position]``); return the warning line
    naming the Ray-only keys that are ignored, or None."""
    where = f"process[{position}] {name}"
    if name not in ACCEPTED:
        raise _refusal(name, where)
    runs_as, _ = ACCEPTED[name]
    if str(args.get("accelerator") or "").lower() == "cuda" and _has_gpu_path(op_class):
        raise RecipeError(
            "accelerator cuda runs its GPU MinHash (cuDF), which hashes differently from Data-Juicer's default "
            f"operator {runs_as}",
            where=f"{where}.accelerator",
            hint=f"remove accelerator (or set it to cpu): it then runs as {runs_as} on the CPU",
        )
    _build_as_data_juicer(where, runs_as, default_args(name, args))
    # Data-Juicer's parser fills in every argument: a Ray-only key left at its default changes nothing
    ray_defaults = _named_params(op_class)
    ignored = sorted(key for key in set(args) & ray_only_keys(name) if args[key] != ray_defaults.get(key))
    if not ignored:
        return None
    return (
        f"{where}: runs as {runs_as} (the rows Data-Juicer's default executor keeps); its Ray-only "
        f"tuning keys are ignored: {', '.join(ignored)}"
    )


def default_args(name: str, args: dict[str, Any]) -> dict[str, Any]:
    """The arguments the default operator of accepted ``name`` is built with (``dedup_stages``'s
    ``args_of``): a Ray version's Ray-only keys dropped, and a shared argument the user left out set to
    the Ray version's default where it differs from the default operator's."""
    args = dict(args or {})
    runs_as, _ = ACCEPTED[name]
    if runs_as == name:
        return args
    ray, default = _named_params(_op_class(name)), _named_params(_op_class(runs_as))
    for key in ray.keys() - default.keys():
        args.pop(key, None)
    for key in ray.keys() & default.keys():
        if key not in args and ray[key] is not inspect.Parameter.empty and ray[key] != default[key]:
            args[key] = ray[key]
    return args


def recipe_stages(recipe: dict[str, Any]) -> list[DedupStage]:
    """The deduplication stages of a checked shard recipe, each with its default operator's arguments."""
    return dedup_stages(recipe["process"], args_of=default_args)


def ray_only_keys(name: str) -> frozenset[str]:
    """The arguments of an accepted Ray version that its default operator does not take."""
    runs_as, _ = ACCEPTED[name]
    if runs_as == name:
        return frozenset()
    return frozenset(_named_params(_op_class(name)).keys() - _named_params(_op_class(runs_as)).keys())


def _op_class(name: str) -> type:
    from data_juicer.ops import OPERATORS

    return OPERATORS.modules[name]


@cache
def _named_params(op_class: type) -> dict[str, Any]:
    """Name -> default of the named ``__init__`` arguments of ``op_class`` and its bases down to
    Data-Juicer's operator kinds (whose keyword arguments every operator shares)."""
    from data_juicer.ops import base_op

    params: dict[str, Any] = {}
    for klass in op_class.__mro__:
        if klass.__module__ == base_op.__name__ or klass is object:
            break
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        for param in list(inspect.signature(init).parameters.values())[1:]:
            if param.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                params.setdefault(param.name, param.default)
    return params


@cache
def _annotations(op_class: type) -> dict[str, Any]:
    annotations: dict[str, Any] = {}
    for klass in op_class.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None or klass is object:
            continue
        for param in list(inspect.signature(init).parameters.values())[1:]:
            if param.annotation is not inspect.Parameter.empty:
                annotations.setdefault(param.name, param.annotation)
    return annotations


def _has_gpu_path(op_class: type) -> bool:
    """Whether the operator switches to a GPU implementation under ``accelerator: cuda``."""
    try:
        return "use_cuda()" in inspect.getsource(op_class)
    except (OSError, TypeError):
        return False


def _build_as_data_juicer(where: str, runs_as: str, args: dict[str, Any]) -> None:
    """Type-check the arguments against the operator's annotations, build it and hash one row, as
    Data-Juicer would at its first row (SimHash: and the library call its ``process`` makes first); a
    sentencepiece model is not loaded (only its path required)."""
    from pydantic import TypeAdapter, ValidationError

    op_class = _op_class(runs_as)
    for key, annotation in _annotations(op_class).items():
        if key not in args:
            continue
        try:
            TypeAdapter(annotation).validate_python(args[key])
        except ValidationError as exc:
            problem = "; ".join(error["msg"] for error in exc.errors())
            raise RecipeError(
                f"{key}={args[key]!r} is not a valid value for {runs_as}: {problem}",
                where=f"{where}.{key}",
                hint=f"fix {key}: see Data-Juicer's documentation of {runs_as}",
            ) from None
        except Exception:  # an annotation pydantic cannot check: Data-Juicer's build below decides
            continue
    sentencepiece = args.get("tokenization") == "sentencepiece" and args.get("tokenizer_model") is not None
    build_args = {**args, "tokenization": "space"} if sentencepiece else args
    if runs_as == "document_simhash_deduplicator" and importlib.util.find_spec("simhash") is None:
        raise RecipeError(
            "simhash-pybind is not installed (Data-Juicer would pip-install it on every node at run time)",
            where=where,
            hint="install data-juicer-elastic's dependencies (README.md, Install) and check with `dj-elastic doctor`",
        )
    try:
        op = op_class(**build_args)
        if not sentencepiece:
            op.compute_hash({op.text_key: _SAMPLE_TEXT})
        if runs_as == "document_simhash_deduplicator":  # its process's first call (refuses distance >= blocks)
            import simhash

            simhash.find_all([0], op.num_blocks, op.hamming_distance)
    except Exception as exc:  # noqa: BLE001 - whatever Data-Juicer raises is the refusal
        raise RecipeError(
            f"Data-Juicer refuses this configuration: {type(exc).__name__}: {exc}",
            where=where,
            hint=f"fix the operator's arguments: see Data-Juicer's documentation of {runs_as}",
        ) from None


def _refusal(name: str, where: str) -> RecipeError:
    if name in _DIFFERENT_HASHES:
        why, what_to_do = _DIFFERENT_HASHES[name]
    elif name.endswith("_with_uid") and name.removesuffix("_with_uid") in ACCEPTED:
        why, what_to_do = _WITH_UID[0], _WITH_UID[1].format(base=name.removesuffix("_with_uid"))
    else:
        why, what_to_do = _OTHER_WHY.format(supported=_SUPPORTED), _OTHER_DO
    return RecipeError(f"this deduplicator is not supported by elastic_sharded: {why}", where=where, hint=what_to_do)
