"""Operators used only by end-to-end tests, loaded through `custom_operator_paths`."""

import time

from data_juicer.ops.base_op import OPERATORS, Filter, Mapper


@OPERATORS.register_module("e2e_sleep_mapper")
class E2ESleepMapper(Mapper):
    """Sleep per row, so a test can kill a worker while it is inside a shard."""

    def __init__(self, seconds_per_row: float = 0.0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds_per_row = seconds_per_row

    def process_single(self, sample):
        time.sleep(self.seconds_per_row)
        return sample


@OPERATORS.register_module("e2e_fail_mapper")
class E2EFailMapper(Mapper):
    """Raise on the row whose `id` equals `fail_id`: that shard can never succeed."""

    def __init__(self, fail_id: int = -1, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_id = fail_id

    def process_single(self, sample):
        if sample.get("id") == self.fail_id:
            raise RuntimeError(f"e2e_fail_mapper: refusing row id {self.fail_id}")
        return sample


@OPERATORS.register_module("e2e_flaky_mapper")
class E2EFlakyMapper(Mapper):
    """Raise on the row whose `id` equals `fail_id` the first time only (a marker file in
    `marker_dir` remembers it across attempts and processes): that shard is retried and succeeds."""

    def __init__(self, fail_id: int = -1, marker_dir: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_id = fail_id
        self.marker_dir = marker_dir

    def process_single(self, sample):
        if sample.get("id") == self.fail_id:
            import os

            try:
                os.close(os.open(os.path.join(self.marker_dir, f"flaky-{self.fail_id}"), os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                return sample
            raise RuntimeError(f"e2e_flaky_mapper: first attempt at row id {self.fail_id} fails")
        return sample


@OPERATORS.register_module("e2e_slow_ids_mapper")
class E2ESlowIdsMapper(Mapper):
    """Sleep on rows with `first_id <= id < end_id` only, so one shard runs long while the others are quick."""

    def __init__(self, seconds_per_row: float = 0.0, first_id: int = 0, end_id: int = 0, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seconds_per_row, self.first_id, self.end_id = seconds_per_row, first_id, end_id

    def process_single(self, sample):
        if self.first_id <= sample.get("id", -1) < self.end_id:
            time.sleep(self.seconds_per_row)
        return sample


def _ids(path: str) -> set:
    """The ids listed in the file at `path` (one per line), read at each call: emptying the file "fixes" the
    operator without changing its code."""
    if not path:
        return set()
    with open(path, encoding="utf-8") as handle:
        return {int(line) for line in handle if line.strip()}


@OPERATORS.register_module("e2e_fail_ids_mapper")
class E2EFailIdsMapper(Mapper):
    """A batched Mapper that raises on any batch holding a row whose `id` is listed in `fail_ids_path`, and
    adds `seen` to the rows of the batches it processes."""

    _batched_op = True

    def __init__(self, fail_ids_path: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_ids_path = fail_ids_path

    def process_batched(self, samples):
        bad = sorted(i for i in samples["id"] if i in _ids(self.fail_ids_path))
        if bad:
            raise ValueError(f"e2e_fail_ids_mapper: cannot process id {bad[0]}")
        samples["seen"] = [True] * len(samples["id"])
        return samples


@OPERATORS.register_module("e2e_fail_ids_filter")
class E2EFailIdsFilter(Filter):
    """A per-row Filter whose stats raise on rows whose `id` is listed in `fail_ids_path`; keeps even ids."""

    def __init__(self, fail_ids_path: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_ids_path = fail_ids_path

    def compute_stats_single(self, sample):
        if sample["id"] in _ids(self.fail_ids_path):
            raise KeyError(f"e2e_fail_ids_filter: no stats for id {sample['id']}")
        sample["__dj__stats__"]["id_parity"] = sample["id"] % 2
        return sample

    def process_single(self, sample):
        return sample["__dj__stats__"]["id_parity"] == 0


@OPERATORS.register_module("e2e_edit_input_filter")
class E2EEditInputFilter(E2EFailIdsFilter):
    """An E2EFailIdsFilter that keeps no row and, when a row's stats fail, edits the job's input in place while
    the shard runs: the first `old` in `input_path` becomes `new`, a string of the same length (same size,
    a new mtime)."""

    def __init__(self, input_path: str = "", old: str = "", new: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        if len(old.encode()) != len(new.encode()):
            raise ValueError("e2e_edit_input_filter: old and new must be the same size")
        self.input_path, self.old, self.new = input_path, old.encode(), new.encode()

    def compute_stats_single(self, sample):
        try:
            return super().compute_stats_single(sample)
        except KeyError:
            with open(self.input_path, "r+b") as handle:
                at = handle.read().find(self.old)
                if at >= 0:  # once: a later call finds the edit made
                    handle.seek(at)
                    handle.write(self.new)
            raise

    def process_single(self, sample):
        return False


@OPERATORS.register_module("e2e_add_file_mapper")
class E2EAddFileMapper(Mapper):
    """Write `path` with `content` when it meets its first row, unless it is there: a file added to a
    directory input while the job runs (after its plan).  Rows pass through unchanged."""

    def __init__(self, path: str = "", content: str = "", *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.path, self.content = path, content

    def process_single(self, sample):
        import os

        if self.path and not os.path.exists(self.path):
            staged = f"{self.path}.{os.getpid()}.tmp"  # renamed into place: never seen half-written
            with open(staged, "w", encoding="utf-8") as handle:
                handle.write(self.content)
            os.replace(staged, self.path)
        return sample
