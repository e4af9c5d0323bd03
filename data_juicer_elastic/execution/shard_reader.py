"""Read one shard into Arrow with the job's row schema (``row_types.ArrowRows``), and find its input
rows again for the writer.  Why not Ray's JSON reader: docs/lossless.md.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final

import jiter

from data_juicer_elastic.errors import IntegrityError
from data_juicer_elastic.execution.row_types import ArrowRows
from data_juicer_elastic.rows.shard_source import ShardSource, iter_content, iter_source_lines

BLOCK_BYTES: Final = 1024 * 1024


def parse(line: bytes, where: str) -> dict[str, Any]:
    try:
        row = jiter.from_json(line)
    except ValueError as exc:  # its scan validated every row: the shard was changed under us
        raise IntegrityError(f"shard row is not valid JSON: {exc}", where=where, hint="prepare a new job") from None
    if type(row) is not dict:
        raise IntegrityError("shard row is not a JSON object", where=where, hint="prepare a new job")
    return row


def read_tables(source: ShardSource, rows: ArrowRows, block_bytes: int = BLOCK_BYTES) -> list[Any]:
    """The shard as Arrow tables of about ``block_bytes`` of input each, rows in order.  Its
    content is checked against its scan while it is read (``rows.shard_source``): a changed input
    is an InputChangedError, raised before the last table is built."""
    tables: list[Any] = []
    pending: list[dict[str, Any]] = []
    size = first = 0
    try:
        for number, line in enumerate(iter_source_lines(source)):
            pending.append(parse(line, f"{source.where} row {number + 1}"))
            size += len(line) + 1
            if size >= block_bytes:
                tables.append(rows.table(pending, first))
                first += len(pending)
                pending, size = [], 0
        if pending:
            tables.append(rows.table(pending, first))
    except IntegrityError:
        # a row that does not parse: the input changed under us (the scan proved every row), and
        # reading it whole says so in the right words; else the original error stands
        for _ in iter_content(source):
            pass
        raise
    return tables


class InputRows:
    """The shard's input rows by row number, for the writer: a forward cursor over the file.

    Output rows come in input order, so one pass parses only the rows asked for; asking for an
    earlier row than the last starts the pass again (never so with Data-Juicer's operators)."""

    def __init__(self, source: ShardSource):
        self.source = source
        self._lines: Generator[bytes, None, None] | None = None
        self._next = 0  # number of the row the cursor reads next
        self._last: tuple[int, dict[str, Any]] | None = None

    def get(self, number: int) -> dict[str, Any]:
        """The input row ``number`` (0-based), parsed; a fresh object the caller may keep."""
        if self._last is not None and self._last[0] == number:
            return self._last[1]
        if self._lines is None or number < self._next:
            self.finish()  # a pass given up is read to its end first: the rows it handed out are checked too
            self._lines, self._next = iter_source_lines(self.source), 0
        line = b""
        while self._next <= number:
            line = next(self._lines, None)
            if line is None:
                raise IntegrityError(
                    f"an output row names input row {number}, but the shard has {self._next} rows",
                    where=self.source.where,
                    hint="an operator changed the internal row number column; report it",
                )
            self._next += 1
        row = parse(line, f"{self.source.where} row {number + 1}")
        self._last = (number, row)
        return row

    def close(self) -> None:
        if self._lines is not None:
            self._lines.close()
            self._lines = None

    def finish(self) -> None:
        """Read the rest of the shard, so its content check runs: the rows handed out came from
        the content that was scanned (InputChangedError otherwise).  Then close."""
        if self._lines is not None:
            for _ in self._lines:
                pass
        self.close()
