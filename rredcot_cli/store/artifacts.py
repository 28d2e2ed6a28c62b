"""Parquet artifacts: the schemas, and the only code that reads or writes them.

Every stage exchanges data as one Parquet file per artifact kind. Rows of every artifact are
keyed by ``(prompt_id, sample_idx)``; token lists (``completion_token_ids``,
``completion_logprobs``, ``token_advantages``) are aligned to the completion's tokens.

- ``write_artifact(kind, columns, path)`` builds a table with exactly the declared schema
  (casting values, failing on missing or extra columns) and writes it atomically.
- ``read_artifact(kind, path)`` reads and validates: a missing file, an unreadable file, missing
  columns, columns of the wrong type, invalid UTF-8 text and malformed rows (misaligned token
  lists, duplicate keys, non-finite numbers) raise ``ArtifactError`` with a one-line message that
  names the file and, for a row, its 0-based index. Extra columns are allowed on read.
"""

from __future__ import annotations

import logging
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from rredcot_cli.errors import ArtifactError, one_line
from rredcot_cli.store.atomic import atomic_path

# The phases a training step's wall time is split into: metrics.parquet has a ``seconds_<phase>``
# column for each. Declared here, with the schema, so the run store depends on nothing above it;
# the step clock (train/steptime.py) times exactly these.
PHASES = ("sampling", "segment", "credit", "old_logprobs", "ref_logprobs", "update", "refresh", "eval")


_ADDED_LATER = b"rredcot.added_later"


def _field(name: str, type_: pa.DataType, nullable: bool = False) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


def _added_field(name: str, type_: pa.DataType) -> pa.Field:
    """A nullable column added to a schema after files without it were written: reading such an
    older file gives a column of nulls instead of an error, so old runs stay readable."""
    return pa.field(name, type_, nullable=True, metadata={_ADDED_LATER: b"1"})


def _is_added_later(field: pa.Field) -> bool:
    return bool(field.metadata) and _ADDED_LATER in field.metadata


_KEY = [_field("prompt_id", pa.string()), _field("sample_idx", pa.int32())]

SAMPLES = pa.schema(
    _KEY
    + [
        _field("prompt", pa.string()),
        _field("prompt_token_ids", pa.list_(pa.int32())),
        _field("completion", pa.string()),
        _field("completion_token_ids", pa.list_(pa.int32())),
        _field("completion_logprobs", pa.list_(pa.float32())),  # aligned to completion_token_ids
        _field("reward", pa.float32()),  # verified reward; 0 when unscorable
        _field("scorable", pa.bool_()),  # False when the verifier could not decide
        _field("gold_answer", pa.string()),
        _field("pred_answer", pa.string(), nullable=True),  # None: no answer found
        _field("benchmark", pa.string()),
        _field("finish_reason", pa.string()),  # "stop" | "length"
        _field("num_tokens", pa.int32()),
        _field("meta", pa.string()),  # JSON text (e.g. the chain's steps)
    ]
)

SEGMENTS = pa.schema(
    _KEY
    + [
        _field("segment_idx", pa.int32()),
        _field("token_start", pa.int32()),  # [token_start, token_end) into completion_token_ids
        _field("token_end", pa.int32()),
        _field("text", pa.string()),
        _field("strategy", pa.string()),  # the segmenter's name
    ]
)

CREDITS = pa.schema(
    _KEY
    + [
        _field("segment_idx", pa.int32()),
        _field("method", pa.string()),
        _field("value", pa.float32(), nullable=True),  # V(S_k) where the method has one
        _field("credit", pa.float32()),
        # Whether V(S_k) rests on evidence (False: the estimator had none and the previous value was
        # kept); null for methods that do not report it, and in files written before it
        _added_field("value_covered", pa.bool_()),
    ]
)

ADVANTAGES = pa.schema(
    _KEY
    + [
        _field("method", pa.string()),
        _field("token_advantages", pa.list_(pa.float32())),  # aligned to completion_token_ids
    ]
)

EVAL = pa.schema(
    _KEY
    + [
        _field("completion", pa.string()),
        _field("num_tokens", pa.int32()),
        _field("pred_answer", pa.string(), nullable=True),
        _field("gold_answer", pa.string()),
        _field("correct", pa.bool_()),
        _field("scorable", pa.bool_()),
        _field("steps", pa.int32(), nullable=True),  # chain length (synthetic benchmarks)
        _field("benchmark", pa.string()),
        _field("model", pa.string()),
        # "stop" | "length" (cut off at the token budget); null in eval files written before it
        _added_field("finish_reason", pa.string()),
    ]
)

TRAIN_METRICS = pa.schema(
    [
        _field("step", pa.int32()),
        _field("reward_mean", pa.float32()),
        _field("accuracy", pa.float32()),
        _field("loss", pa.float32()),
        _field("kl", pa.float32()),
        _field("entropy", pa.float32()),
        _field("clip_fraction", pa.float32()),
        _field("grad_norm", pa.float32()),
        _field("lr", pa.float32()),
        _field("response_tokens_mean", pa.float32()),
        _field("tokens", pa.int64()),
        _field("seconds", pa.float32()),
        _field("eval_accuracy", pa.float32(), nullable=True),  # only on eval steps
        # train.dynamic_sampling: sampling rounds this step and groups trained on (null without it)
        _added_field("sampling_rounds", pa.int32()),
        _added_field("groups_trained", pa.int32()),
        # methods with a learned critic (ppo): its loss and explained variance (null otherwise)
        _added_field("value_loss", pa.float32()),
        _added_field("value_explained_variance", pa.float32()),
        # mean log pi_sampler - log pi_trainer over the step's tokens (sampler/trainer mismatch),
        # and fp16 loss-scale overflows skipped (null when there was no update)
        _added_field("sampler_kl", pa.float32()),
        _added_field("overflow_skipped", pa.int32()),
        # wall seconds of each phase of the step (rredcot_cli/train/steptime.py; eval only on eval steps)
        # and the positions the credit method ran through the model for value estimation
        *(_added_field(f"seconds_{phase}", pa.float32()) for phase in PHASES),
        _added_field("credit_forward_tokens", pa.int64()),
        # std of the token advantages over the step's completion tokens: how spread the signal is
        _added_field("advantage_std", pa.float32()),
        # share of the inner segment boundaries whose value rested on evidence (rredcot: the others'
        # suffixes or answers); null for methods that estimate no values
        _added_field("value_coverage", pa.float32()),
        # sampler vs trainer log-probs on the sampled tokens (rredcot_cli/train/mismatch.py): mean and
        # max |delta log p|, k3 KL(sampler || trainer), share of tokens with ratio past
        # train.sampler_correction_cap, and the tokens measured; NaN (and 0 tokens) on a step whose
        # update ran no forward; null in files written before them
        _added_field("mismatch_logp_abs_mean", pa.float64()),
        _added_field("mismatch_logp_abs_max", pa.float64()),
        _added_field("mismatch_kl", pa.float64()),
        _added_field("mismatch_past_cap", pa.float32()),
        _added_field("mismatch_tokens", pa.int64()),
    ]
)


# One row per credit method judged by `rredcot judge` on one run's saved traces (see
# rredcot_cli/report/judge.py). Correlations are with Monte Carlo reference values (null: undefined, e.g.
# a method without values); token counts are per run of the method.
CREDIT_QUALITY = pa.schema(
    [
        _field("method", pa.string()),
        _field("batch", pa.int32()),  # which of judge.batches independent batches (0 with one)
        _field("credit_constant", pa.bool_()),  # every completion's segments share one credit
        _field("value_spearman", pa.float64(), nullable=True),
        _field("value_pearson", pa.float64(), nullable=True),
        _field("value_spearman_inner", pa.float64(), nullable=True),  # without the last segment
        _field("value_pearson_inner", pa.float64(), nullable=True),
        _field("credit_spearman", pa.float64(), nullable=True),
        _field("credit_pearson", pa.float64(), nullable=True),
        # the same within completions of one reward (report/judge.py spearman_within): where the
        # outcome control carries nothing; null in files written before them
        _added_field("value_spearman_within", pa.float64()),
        _added_field("credit_spearman_within", pa.float64()),
        # each segment's mean token advantage (after the advantage rule) against the reference
        # credit, over all segments and within one reward
        _added_field("advantage_spearman", pa.float64()),
        _added_field("advantage_spearman_within", pa.float64()),
        _field("first_error_rate", pa.float64(), nullable=True),  # null: benchmark has no step check
        _field("first_error_chance", pa.float64(), nullable=True),
        _field("first_error_completions", pa.int32()),
        _field("advantage_std", pa.float64(), nullable=True),  # null with one rerun
        _field("seconds", pa.float64()),
        _field("seconds_vs_sample", pa.float64(), nullable=True),  # null: no sample-stage manifest
        _field("forward_tokens", pa.int64()),
        _field("generated_tokens", pa.int64()),
        _field("backward_tokens", pa.int64()),
        # share of inner boundaries whose value rested on evidence (null: the method reports none)
        _added_field("value_coverage", pa.float64()),
        # mean squared difference from the reference values on inner boundaries (report/judge.py
        # agreement); null without values, and in files written before it
        _added_field("value_mse_inner", pa.float64()),
    ]
)


# The judge's Monte Carlo reference, V(S_0..S_K) of one completion per row (NaN-free, K_i + 1
# values), kept so that judging more methods on the same traces later does not sample it again.
REFERENCE_VALUES = pa.schema(
    _KEY
    + [
        _field("values", pa.list_(pa.float64())),
    ]
)


@dataclass(frozen=True)
class ArtifactSpec:
    name: str  # the artifact kind, also the key under cfg.inputs
    file_name: str
    schema: pa.Schema
    made_by_stage: str  # the stage whose output folder holds it by default


ARTIFACTS: dict[str, ArtifactSpec] = {
    spec.name: spec
    for spec in [
        ArtifactSpec("samples", "samples.parquet", SAMPLES, "sample"),
        ArtifactSpec("segments", "segments.parquet", SEGMENTS, "segment"),
        ArtifactSpec("credits", "credits.parquet", CREDITS, "attribute"),
        ArtifactSpec("advantages", "advantages.parquet", ADVANTAGES, "attribute"),
        ArtifactSpec("eval", "eval.parquet", EVAL, "eval"),
        ArtifactSpec("train_metrics", "metrics.parquet", TRAIN_METRICS, "train"),
        ArtifactSpec("credit_quality", "credit_quality.parquet", CREDIT_QUALITY, "judge"),
        ArtifactSpec("reference_values", "reference.parquet", REFERENCE_VALUES, "judge"),
    ]
}

_KIND_METADATA_KEY = b"rredcot.artifact"


def get_spec(kind: str) -> ArtifactSpec:
    """The ``ArtifactSpec`` of ``kind``; ``ValueError`` for an unknown kind (a programming error)."""
    if kind not in ARTIFACTS:
        raise ValueError(f"unknown artifact kind {kind!r}; known: {', '.join(ARTIFACTS)}")
    return ARTIFACTS[kind]


def _as_columns(kind: str, data: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Column-oriented view of ``data`` (a dict of columns or a list of row dicts)."""
    if isinstance(data, Mapping):
        return dict(data)
    rows = list(data)
    if not rows:
        return {name: [] for name in get_spec(kind).schema.names}
    names = list(rows[0])
    for i, row in enumerate(rows):
        if set(row) != set(names):
            raise ArtifactError(
                f"{kind}: row {i} has columns {sorted(row)}, but row 0 has {sorted(names)}"
            )
    return {name: [row[name] for row in rows] for name in names}


_SURROGATE = re.compile("[\ud800-\udfff]")


def _utf8_strings(kind: str, column: str, values: Sequence[Any]) -> list[Any]:
    """``values`` with text that UTF-8 cannot encode (lone surrogates, e.g. from a decoder that
    escaped invalid bytes) replaced by U+FFFD, logged once per column. The token ids stay the
    record of what was generated; refusing the text would lose the whole stage's work."""
    fixed, changed = [], 0
    for value in values:
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                value = _SURROGATE.sub("\ufffd", value)
                changed += 1
        fixed.append(value)
    if changed:
        logging.getLogger(__name__).warning(
            "%s: %d value(s) of column %s were not valid Unicode; unencodable characters were "
            "replaced by U+FFFD", kind, changed, column)
    return fixed


def build_table(kind: str, data: Mapping[str, Any] | Sequence[Mapping[str, Any]]) -> pa.Table:
    """A ``pyarrow.Table`` with exactly the schema of ``kind``, built from columns or rows.

    Values are cast to the declared types (e.g. Python ints to int32, float64 to float32).
    Raises ``ArtifactError`` on missing or extra columns, uncastable values, unequal column
    lengths, or nulls in a non-nullable column.
    """
    spec = get_spec(kind)
    columns = _as_columns(kind, data)
    missing = [f.name for f in spec.schema if f.name not in columns and not _is_added_later(f)]
    extra = [name for name in columns if name not in spec.schema.names]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing columns: {', '.join(missing)}")
        if extra:
            parts.append(f"unexpected columns: {', '.join(extra)}")
        raise ArtifactError(f"cannot write {kind}: {'; '.join(parts)}")
    arrays = []
    for field in spec.schema:
        values = columns.get(field.name)
        if values is None:  # an added-later column the writer does not fill
            arrays.append(pa.nulls(_column_length(columns), type=field.type))
            continue
        try:
            if isinstance(values, (pa.Array, pa.ChunkedArray)):
                array = values.cast(field.type)
            elif field.type == pa.string():
                array = pa.array(_utf8_strings(kind, field.name, values), type=field.type, from_pandas=False)
            else:
                array = pa.array(values, type=field.type, from_pandas=False)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError, ValueError) as e:
            raise ArtifactError(f"cannot write {kind}: column {field.name} is not {field.type} ({one_line(e)})") from e
        if not field.nullable and array.null_count:
            raise ArtifactError(f"cannot write {kind}: column {field.name} has {array.null_count} nulls")
        arrays.append(array)
    lengths = {len(a) for a in arrays}
    if len(lengths) > 1:
        sizes = ", ".join(f"{f.name}={len(a)}" for f, a in zip(spec.schema, arrays))
        raise ArtifactError(f"cannot write {kind}: columns have different lengths ({sizes})")
    return pa.Table.from_arrays(arrays, schema=spec.schema)


def _column_length(columns: Mapping[str, Any]) -> int:
    return len(next(iter(columns.values()))) if columns else 0


def write_artifact(
    kind: str, columns: Mapping[str, Any] | Sequence[Mapping[str, Any]], path: str | Path
) -> Path:
    """Write ``columns`` (dict of columns, or list of row dicts) as a ``kind`` artifact at ``path``.

    The file appears atomically: readers see the old file or the complete new one. Returns the path.
    """
    return write_table(kind, build_table(kind, columns), path)


def write_table(kind: str, table: pa.Table, path: str | Path, hidden: bool = False) -> Path:
    """Write ``table``, made by ``build_table(kind, ...)`` (not converted again), as a ``kind``
    artifact at ``path``, atomically (``hidden``: see ``atomic_path``; for a part of a folder
    artifact). Returns the path."""
    path = Path(path)
    table = table.replace_schema_metadata({_KIND_METADATA_KEY: kind.encode()})
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path, needed=table.nbytes, hidden=hidden) as tmp:  # in memory; Parquet compresses it
        pq.write_table(table, tmp)
    return path


# The files of a folder artifact (train's metrics.parquet: store/metrics_log.py), one table in name order.
PART_PATTERN = "part-*.parquet"


def part_name(index: int) -> str:
    """The file name of part ``index`` of a folder artifact (zero-padded: name order is index order)."""
    return f"part-{index:06d}.parquet"


def read_artifact(kind: str, path: str | Path) -> pa.Table:
    """Read the ``kind`` artifact at ``path`` and check its columns against the schema.

    ``path`` is one Parquet file, or a folder of part files (``PART_PATTERN``, as train's
    metrics.parquet is written since it grows by parts; older runs hold one file), read as one
    table in name order. Raises ``ArtifactError`` if the file is missing (naming the stage that
    makes it), is not readable Parquet, lacks columns, has columns of another type, or has nulls
    where none are allowed. Extra columns are kept.
    """
    spec = get_spec(kind)
    path = Path(path)
    if not path.exists():
        raise ArtifactError(
            f"no {spec.file_name} at {path} (it is made by `rredcot {spec.made_by_stage}`)"
        )
    if path.is_dir():
        parts = [_read_file(kind, part) for part in sorted(path.glob(PART_PATTERN))]
        if not parts:  # a folder written before its first row (a resume from step 0)
            return build_table(kind, [])
        # parts of one writer have one schema; "default" fills an extra column one part lacks with nulls
        return pa.concat_tables(parts, promote_options="default")
    if not path.is_file():
        raise ArtifactError(f"{path} is not a file; expected a {kind} Parquet file ({spec.file_name})")
    return _read_file(kind, path)


def _read_file(kind: str, path: Path) -> pa.Table:
    """One Parquet file of ``kind``, checked against its schema (``read_artifact``)."""
    spec = get_spec(kind)
    try:
        # One open file: by path, pyarrow opens the file more than once (footer, then pages), so
        # a writer's atomic replace between the opens (train's live metrics.parquet) reads as a
        # torn file. The handle pins one version.
        with open(path, "rb") as file:
            table = pq.read_table(file)
        names = table.schema.names  # decoding them fails on a damaged footer
    except (pa.ArrowException, OSError, UnicodeDecodeError) as e:
        raise ArtifactError(f"{path} is not a readable Parquet file ({one_line(e)})") from e
    problems = []
    for field in spec.schema:
        if field.name not in names and _is_added_later(field):
            table = table.append_column(field, pa.nulls(table.num_rows, type=field.type))
            continue
        if field.name not in names:
            problems.append(f"missing column {field.name} ({field.type})")
            continue
        actual = table.schema.field(field.name).type
        if actual != field.type:
            problems.append(f"column {field.name} is {actual}, expected {field.type}")
        elif not field.nullable and table.column(field.name).null_count:
            problems.append(f"column {field.name} has nulls")
    if problems:
        raise ArtifactError(f"{path} is not a valid {kind} artifact: {'; '.join(problems)}")
    _check_utf8(path, table, spec)
    _check_rows(path, kind, table)
    return table


def _check_utf8(path: Path, table: pa.Table, spec: ArtifactSpec) -> None:
    """Refuse string columns holding invalid UTF-8 (Parquet from another writer may), naming the row."""
    for field in spec.schema:
        if field.type != pa.string():
            continue
        offset = 0
        for chunk in table.column(field.name).chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowInvalid as e:
                found = re.search(r"index (\d+)", str(e))
                where = f"row {offset + int(found.group(1))}" if found else "a row"
                raise ArtifactError(f"{path} {where}: column {field.name} is not valid UTF-8 text") from e
            offset += len(chunk)


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    """Index of the first true value of a boolean array (nulls count as false), or None."""
    hits = pc.indices_nonzero(pc.fill_null(mask, False)) if len(mask) else []
    return int(hits[0].as_py()) if len(hits) else None


def _check_rows(path: Path, kind: str, table: pa.Table) -> None:
    """Row-level checks a schema cannot express; the first bad row is named (0-based).

    - samples: one log-prob per completion token, ``num_tokens`` equal to their count, a finite
      reward, and unique ``(prompt_id, sample_idx)`` keys (duplicates would mix two samples);
    - segments: ``0 <= token_start <= token_end``;
    - credits: finite credits; advantages: finite token advantages (a NaN would poison training).
    """
    def fail(row: int, message: str) -> None:
        raise ArtifactError(f"{path} row {row}: {message}")

    if kind == "samples":
        ids = pc.list_value_length(table.column("completion_token_ids"))
        lps = pc.list_value_length(table.column("completion_logprobs"))
        row = _first(pc.not_equal(ids, lps))
        if row is not None:
            fail(row, f"{lps[row].as_py()} completion_logprobs for {ids[row].as_py()} completion_token_ids")
        row = _first(pc.not_equal(ids, pc.cast(table.column("num_tokens"), pa.int32())))
        if row is not None:
            fail(row, f"num_tokens is {table.column('num_tokens')[row].as_py()} but there are "
                      f"{ids[row].as_py()} completion_token_ids")
        row = _first(pc.invert(pc.is_finite(table.column("reward"))))
        if row is not None:
            fail(row, f"reward is {table.column('reward')[row].as_py()}, not a finite number")
        seen: dict[tuple[str, int], int] = {}
        for i, key in enumerate(zip(table.column("prompt_id").to_pylist(), table.column("sample_idx").to_pylist())):
            if key in seen:
                fail(i, f"duplicate key (prompt_id={key[0]!r}, sample_idx={key[1]}), first at row {seen[key]}")
            seen[key] = i
    elif kind == "segments":
        start, end = table.column("token_start"), table.column("token_end")
        row = _first(pc.or_(pc.less(start, 0), pc.less(end, start)))
        if row is not None:
            fail(row, f"segment [{start[row].as_py()}, {end[row].as_py()}) is not a token range")
    elif kind == "credits":
        row = _first(pc.invert(pc.is_finite(table.column("credit"))))
        if row is not None:
            fail(row, f"credit is {table.column('credit')[row].as_py()}, not a finite number")
    elif kind == "advantages":
        column = table.column("token_advantages")
        flat = pc.list_flatten(column)
        bad = _first(pc.invert(pc.is_finite(flat)))
        if bad is not None:
            row = pc.list_parent_indices(column)[bad].as_py()
            fail(row, f"token_advantages holds {flat[bad].as_py()}, not a finite number")


def validate_segments_tile(segments: pa.Table, samples: pa.Table) -> None:
    """Check that the segments of every sample tile its completion exactly.

    For each ``(prompt_id, sample_idx)`` of ``samples`` the segments, ordered by
    ``segment_idx``, must be numbered 0..K-1 (K >= 1), start at token 0, be contiguous
    (``token_start == previous token_end``), be non-empty, and end at
    ``len(completion_token_ids)``. An empty completion is tiled by one segment [0, 0).
    Segments of unknown samples are errors too. Raises ``ArtifactError`` listing the first
    violations.
    """
    lengths = {
        (pid, int(idx)): len(ids)
        for pid, idx, ids in zip(
            samples.column("prompt_id").to_pylist(),
            samples.column("sample_idx").to_pylist(),
            samples.column("completion_token_ids").to_pylist(),
        )
    }
    by_sample: dict[tuple[str, int], list[tuple[int, int, int]]] = defaultdict(list)
    for pid, idx, seg, start, end in zip(
        segments.column("prompt_id").to_pylist(),
        segments.column("sample_idx").to_pylist(),
        segments.column("segment_idx").to_pylist(),
        segments.column("token_start").to_pylist(),
        segments.column("token_end").to_pylist(),
    ):
        by_sample[(pid, int(idx))].append((int(seg), int(start), int(end)))

    problems: list[str] = []
    for key in by_sample.keys() - lengths.keys():
        problems.append(f"{key}: segments for a sample that is not in samples")
    for key, length in lengths.items():
        segs = sorted(by_sample.get(key, []))
        if not segs:
            problems.append(f"{key}: no segments")
            continue
        if [s[0] for s in segs] != list(range(len(segs))):
            problems.append(f"{key}: segment_idx is {[s[0] for s in segs]}, expected 0..{len(segs) - 1}")
            continue
        if segs[0][1] != 0:
            problems.append(f"{key}: first segment starts at {segs[0][1]}, not 0")
        for (k0, _, end0), (k1, start1, _) in zip(segs, segs[1:]):
            if start1 != end0:
                problems.append(f"{key}: segment {k1} starts at {start1} but segment {k0} ends at {end0}")
        if length > 0:
            for k, start, end in segs:
                if end <= start:
                    problems.append(f"{key}: segment {k} is empty or reversed [{start}, {end})")
        elif len(segs) != 1:
            problems.append(f"{key}: empty completion must have exactly one segment [0, 0)")
        if segs[-1][2] != length:
            problems.append(f"{key}: last segment ends at {segs[-1][2]}, completion has {length} tokens")
    if problems:
        shown = "; ".join(sorted(problems)[:5])
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ArtifactError(f"segments do not tile the completions: {shown}{more}")
