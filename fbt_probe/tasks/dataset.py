"""Dataset files: `DIR/<task>.parquet`, `DIR/<task>.manifest.json` and the `DIR/tokenizer.json` used.

The Parquet file is byte-identical for the same spec, seed, tokenizer and library versions. The
manifest (written last, so a dataset without one is incomplete) records the spec, the Parquet
sha256, the tokenizer sha256, counts per cell, the package version and provenance.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from fbt_probe._version import __version__
from fbt_probe.errors import FbtError
from fbt_probe.io import atomic_path, read_json, sha256_file, write_json
from fbt_probe.marker import named_outputs, refuse_named
from fbt_probe.provenance import provenance
from fbt_probe.tasks.checker import disagreement
from fbt_probe.tasks.generators import COLUMNS
from fbt_probe.tasks.spec import spec_from_dict
from fbt_probe.tasks.tokenizer import answer_ids, save_tokenizer, tokenizer_sha256

FORMAT = "fbt-probe.tasks.dataset/1"
COMMAND = "tasks generate"  # the writer of a dataset's files in its folder's marker
# what every later stage keeps of a sample beside its token ids (activation folders, probe tables)
SAMPLE_COLUMNS = ("task", "pair_id", "group_id", "label", "label_word", "length_knob", "n_tokens")


def arrow_schema():

    types = {
        "task": pa.string(),
        "text": pa.string(),
        "token_ids": pa.list_(pa.field("element", pa.int32())),
        "label": pa.int64(),
        "label_word": pa.string(),
        "pair_id": pa.int64(),
        "group_id": pa.string(),
        "context_id": pa.string(),
        "length_knob": pa.int64(),
        "n_tokens": pa.int64(),
        "seed": pa.int64(),
    }
    return pa.schema([(c, types[c]) for c in COLUMNS])


def schema_record() -> dict:
    return {f.name: str(f.type) for f in arrow_schema()}


def dataset_paths(out_dir, task: str) -> tuple[Path, Path, Path]:
    out_dir = Path(out_dir)
    return out_dir / f"{task}.parquet", out_dir / f"{task}.manifest.json", out_dir / "tokenizer.json"


def knob_name(spec: dict) -> str:
    """What a dataset's `length_knob` counts, from its spec record."""
    if spec["kind"] == "compose":
        return "steps"
    if spec["kind"] != "registers":
        return "distractors"
    return "registers" if spec.get("assignments") is not None else "writes_per_register"


def _label_token_ids(tok, query_line: str, words) -> dict:
    """The answer token id of each label word after the query line (None if it is not one token)."""
    out = {}
    for word in words:
        ids, pos = answer_ids(tok, query_line, word)
        out[word] = None if pos is None else ids[pos]
    return out


def dataset_files(out_dir, task: str, tokenizer, force: bool = False, command: str = COMMAND) -> list[Path]:
    """The files `write_dataset` writes for `task` into `out_dir`, checked (`fbt_probe.marker.
    refuse_named`): the Parquet and its manifest, and tokenizer.json unless the folder holds this very
    tokenizer already. A tokenizer.json of another tokenizer is replaced only with `force`, and only
    where the folder's marker lists it as written by `command`, unchanged."""
    parquet, manifest, tok_path = dataset_paths(out_dir, task)
    same = tok_path.is_file() and not tok_path.is_symlink() and sha256_file(tok_path) == tokenizer_sha256(tokenizer)
    if tok_path.exists() and not same and not force:
        raise FbtError(
            f"{tok_path}: already exists and holds another tokenizer; refusing to overwrite (pass --force, or "
            "another --out folder, for a dataset with a different tokenizer)"
        )
    files = [parquet, manifest] + ([] if same else [tok_path])
    refuse_named(files, force, command)
    return files


def write_dataset(
    df: pd.DataFrame,
    out_dir,
    tokenizer,
    force: bool = False,
    tokenizer_source: str = "builtin",
    command: str = COMMAND,
) -> Path:
    """Write `df` (from `generate`) and its manifest into `out_dir`; return the Parquet path.

    Refuses to replace an existing Parquet/manifest, or a different `tokenizer.json`, without `force`;
    with it, only files the folder's marker lists as written by `command` (`dataset_files`). The
    files are recorded in the folder's marker, under the folder's lock."""

    task = df.attrs["spec"]["task"]
    parquet, manifest, tok_path = dataset_paths(out_dir, task)
    files = dataset_files(out_dir, task, tokenizer, force, command)
    tok_sha = tokenizer_sha256(tokenizer)
    with named_outputs(files, command, force):
        if tok_path in files:
            save_tokenizer(tokenizer, tok_path)
        _write_files(df, parquet, manifest, tok_path, tokenizer, tok_sha, task, tokenizer_source)
    return parquet


def _write_files(df, parquet: Path, manifest: Path, tok_path: Path, tokenizer, tok_sha: str, task: str, source: str):
    table = pa.Table.from_pydict({c: df[c].tolist() for c in COLUMNS}, schema=arrow_schema())
    with atomic_path(parquet) as tmp:
        pq.write_table(table, tmp, compression="zstd")
    write_json(
        manifest,
        {
            "format": FORMAT,
            "task": task,
            "file": parquet.name,
            "sha256": sha256_file(parquet),
            "rows": len(df),
            "pairs": len(df) // 2,
            "schema": schema_record(),
            "spec": df.attrs["spec"],
            "seed": df.attrs["seed"],
            "groups": df.attrs["groups"],
            "n_groups": int(df["group_id"].nunique()),
            "knob": knob_name(df.attrs["spec"]),
            "counts": df.attrs["counts"],
            "suffix_tokens": df.attrs.get("suffix_tokens"),
            "padded_to": df.attrs.get("padded_to"),
            "tokenizer": {
                "file": tok_path.name,
                "sha256": tok_sha,
                "source": source,
                "vocab_size": tokenizer.get_vocab_size(),
                "final_token_id": df.attrs["final_token_id"],
                "final_token": df.attrs["final_token"],
                "label_token_ids": _label_token_ids(
                    tokenizer, df.text.iloc[0], df.attrs["spec"]["label_words"].values()
                ),
            },
            "package_version": __version__,
            "provenance": provenance(),
        },
    )


def _manifest_for(path: Path) -> tuple[Path, Path]:
    """(parquet, manifest) from either file's path."""
    if path.name.endswith(".manifest.json"):
        return path.with_name(path.name[: -len(".manifest.json")] + ".parquet"), path
    return path, path.with_name(path.stem + ".manifest.json")


def load_dataset(path) -> pd.DataFrame:
    """A dataset written by `write_dataset` (the .parquet or its .manifest.json), checked against its
    manifest: sha256, schema and row count. `df.attrs['manifest']` holds the manifest."""

    parquet, manifest_path = _manifest_for(Path(path))
    if not parquet.is_file():
        raise FbtError(f"{parquet}: dataset file not found")
    manifest = read_json(
        manifest_path, what="dataset manifest (written beside the .parquet by `fbt-probe tasks generate`)"
    )
    if manifest.get("format") != FORMAT:
        raise FbtError(f"{manifest_path}: field 'format': expected {FORMAT!r}, got {manifest.get('format')!r}")
    if manifest.get("sha256") != sha256_file(parquet):
        raise FbtError(
            f"{parquet}: sha256 does not match field 'sha256' of {manifest_path.name} (file changed or truncated)"
        )
    try:
        table = pq.read_table(parquet)
    except Exception as exc:  # pyarrow raises several types for a damaged file
        raise FbtError(f"{parquet}: not a readable Parquet file ({exc})") from None
    got = {f.name: str(f.type) for f in table.schema}
    if got != schema_record() or manifest.get("schema") != schema_record():
        diff = sorted(set(schema_record().items()) ^ set(got.items()))
        raise FbtError(
            f"{parquet}: schema does not match the dataset schema (differs in {diff or 'manifest field schema'})"
        )
    if table.num_rows != manifest.get("rows"):
        raise FbtError(
            f"{parquet}: {table.num_rows} rows but field 'rows' of {manifest_path.name} says {manifest.get('rows')}"
        )
    df = table.to_pandas()
    check_labels(df, manifest, parquet)
    df.attrs["manifest"] = manifest
    return df


def check_labels(df: pd.DataFrame, manifest: dict, parquet: Path) -> None:
    """Re-derive every row's label from its text with the independent interpreter (under the spec
    the manifest records) and refuse a file whose labels or label words disagree: a sha256 in the
    manifest proves the file is the one it names, not that its labels are the task's."""

    if not isinstance(manifest.get("spec"), dict):
        raise FbtError(
            f"{parquet}: the manifest's field 'spec' is missing or not an object (regenerate with `fbt-probe tasks generate`)"
        )
    spec = spec_from_dict(manifest["spec"], source=f"{parquet.name}'s manifest, field 'spec'")
    for row, (text, label, word, pair) in enumerate(zip(df["text"], df["label"], df["label_word"], df["pair_id"])):
        got = disagreement(spec, text, label, word, where=f"{parquet}: row {row} (pair {pair})")
        if got is not None:
            raise FbtError(
                f"{parquet}: row {row} (pair {pair}): field 'label' is {label} ({word}) but its text says "
                f"{got} ({spec.label_words[got]}); the labels were changed after generation "
                "(regenerate with `fbt-probe tasks generate`)"
            )
