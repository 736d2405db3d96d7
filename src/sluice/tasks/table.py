"""One party's own table in a split (vertical) task: rows keyed by a sample id, the leader's with the labels.

:func:`read_table` reads a party's CSV or Parquet file into a :class:`Table` and refuses, with one line that names
the file, the column and the row, whatever would otherwise be guessed: a missing id column, an empty or repeated id,
a cell that is not a number, a missing label, a missing feature value (unless ``missing`` says how to treat it).
:func:`standardise` scales a party's own features by its training rows. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from sluice.errors import DataError

_MISSING = ("refuse", "drop", "mean", "zero")
_LABEL_KINDS = ("auto", "classification", "regression")
_SUFFIXES = (".csv", ".parquet", ".pq")
# what counts as an empty cell in a text column: pyarrow's CSV null tokens
_NULLS = ("", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN", "N/A", "NA",
          "NULL", "NaN", "n/a", "nan", "null")


@dataclass(frozen=True, eq=False)
class Table:
    """The rows one party of a split task holds."""

    ids: np.ndarray  # str (n,), unique
    X: np.ndarray  # float64 (n, *feature_shape); (n, 0) when the party holds no feature
    y: np.ndarray | None = None  # the leader's labels: int64 class ids (n,) or float32 targets (n, k)
    columns: tuple[str, ...] = ()  # feature column names (for messages)
    test: np.ndarray | None = None  # bool (n,): rows a dataset holds out for testing itself; None: the split is drawn
    classes: tuple[str, ...] = ()  # names of the classes when labels were strings (class id i = classes[i])
    name: str = "table"

    def __post_init__(self):
        ids, X, y, test, name = self.ids, self.X, self.y, self.test, self.name
        if not isinstance(ids, np.ndarray) or ids.ndim != 1:
            raise DataError(f"{name}: ids must be a 1-d array of strings")
        if ids.dtype.kind == "O" and all(isinstance(i, str) for i in ids):
            ids = ids.astype(str)
            object.__setattr__(self, "ids", ids)
        if ids.dtype.kind != "U":
            raise DataError(f"{name}: ids must be strings, not {ids.dtype}")
        n = len(ids)
        if (ids == "").any():
            raise DataError(f"{name}: row {int(np.argmax(ids == '')) + 1} has an empty id")
        if not isinstance(X, np.ndarray) or X.dtype != np.float64 or X.ndim < 2 or len(X) != n:
            got = f"{X.dtype} {X.shape}" if isinstance(X, np.ndarray) else type(X).__name__
            raise DataError(f"{name}: X must be a float64 array of shape ({n}, features...), not {got}")
        width = int(np.prod(X.shape[1:]))
        if self.columns and (len(self.columns) != width or len(set(self.columns)) != width):
            raise DataError(f"{name}: {len(self.columns)} column names for {width} features (or names repeated)")
        if y is not None:
            _check_labels(y, n, len(self.classes), name)
        elif self.classes:
            raise DataError(f"{name}: classes given without labels")
        if test is not None and (not isinstance(test, np.ndarray) or test.dtype != np.bool_ or test.shape != (n,)):
            raise DataError(f"{name}: test must be a bool array of shape ({n},)")
        order = np.argsort(ids, kind="stable")
        ordered = ids[order]
        same = np.flatnonzero(ordered[1:] == ordered[:-1])
        if same.size:
            i, j = order[same[0]], order[same[0] + 1]
            raise DataError(f"{name}: id '{ids[i]}' appears twice (rows {min(i, j) + 1} and {max(i, j) + 1})")
        object.__setattr__(self, "_order", order)
        object.__setattr__(self, "_sorted", ordered)

    @property
    def kind(self) -> Literal["classification", "regression"] | None:
        if self.y is None:
            return None
        return "classification" if self.y.dtype == np.int64 else "regression"

    def rows(self, ids: Sequence[str]) -> np.ndarray:
        """The int64 positions of ``ids`` in this table, in the order asked."""
        want = np.asarray(ids, dtype=str).reshape(-1)
        pos = np.minimum(np.searchsorted(self._sorted, want), max(len(self.ids) - 1, 0))
        found = self._sorted[pos] == want if len(self.ids) else np.zeros(len(want), dtype=bool)
        if not found.all():
            lost = want[~found]
            raise DataError(f"{len(lost)} of the {len(want)} ids are not in {self.name} "
                            f"(first: {', '.join(lost[:3].tolist())})")
        return self._order[pos].astype(np.int64)


def _check_labels(y: np.ndarray, n: int, classes: int, name: str) -> None:
    if not isinstance(y, np.ndarray) or len(y) != n:
        raise DataError(f"{name}: labels must be an array of {n} rows")
    if y.dtype == np.int64 and y.ndim == 1:
        if n and y.min() < 0:
            raise DataError(f"{name}: class id {y.min()} is negative")
        if classes and n and y.max() >= classes:
            raise DataError(f"{name}: class id {y.max()} but only {classes} class names")
    elif y.dtype == np.float32 and y.ndim == 2 and y.shape[1] >= 1:
        if classes:
            raise DataError(f"{name}: class names given for regression targets")
    else:
        raise DataError(f"{name}: labels must be int64 class ids (n,) or float32 targets (n, k), "
                        f"not {y.dtype} {y.shape}")


def read_table(path: str | Path, *, id_column: str = "id", label_column: str | None = None,
               columns: Sequence[str] | None = None, missing: Literal["refuse", "drop", "mean", "zero"] = "refuse",
               label_kind: Literal["auto", "classification", "regression"] = "auto") -> Table:
    """Read one party's table from a ``.csv`` (comma separated, with a header row) or ``.parquet``/``.pq`` file.

    Ids are read as the strings written; ``label_column`` (the leader's) gives the labels; the features are
    ``columns`` in that order or else every other column. ``missing`` says what a missing feature value does:
    ``refuse`` it, ``drop`` its row, or fill it with the column's ``mean`` or ``zero``. Labels are never filled.
    """
    if missing not in _MISSING:
        raise DataError(f"missing={missing!r}; allowed: {', '.join(_MISSING)}")
    if label_kind not in _LABEL_KINDS:
        raise DataError(f"label_kind={label_kind!r}; allowed: {', '.join(_LABEL_KINDS)}")
    path = Path(path)
    f = str(path)
    data = _load(path, id_column)
    names = data.column_names
    feats = _feature_names(f, names, id_column, label_column, columns)
    n = data.num_rows
    if n == 0:
        raise DataError(f"{f}: no data rows")
    ids = _read_ids(f, data.column(id_column), id_column)
    y, classes = None, ()
    if label_column is not None:
        y, classes = _read_labels(f, data.column(label_column), label_column, ids, label_kind)
    X = np.empty((n, len(feats)))
    for j, c in enumerate(feats):
        X[:, j] = _numbers(f, data.column(c), c, ids)
    keep = _fill(f, X, feats, ids, missing)
    if keep is not None:
        ids, X, y = ids[keep], X[keep], None if y is None else y[keep]
    return Table(ids=ids, X=X, y=y, columns=tuple(feats), classes=classes, name=path.name)


def _load(path: Path, id_column: str):
    pa, _ = _arrow()
    f = str(path)
    if path.suffix.lower() not in _SUFFIXES:
        raise DataError(f"{f}: unknown file type '{path.suffix}'; a table is a {', '.join(_SUFFIXES)} file")
    if not path.is_file():
        raise DataError(f"{f}: no such file")
    try:
        if path.suffix.lower() == ".csv":
            from pyarrow import csv

            return csv.read_csv(path, convert_options=csv.ConvertOptions(column_types={id_column: pa.string()}))
        from pyarrow import parquet

        return parquet.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{f}: cannot be read: {' '.join(str(e).split())}") from e


def _feature_names(f: str, names: list[str], id_column: str, label_column: str | None,
                   columns: Sequence[str] | None) -> list[str]:
    twice = sorted({c for c in names if names.count(c) > 1})
    if twice:
        raise DataError(f"{f}: column '{twice[0]}' appears more than once in the header")
    has = ", ".join(names)
    if id_column not in names:
        raise DataError(f"{f}: no id column '{id_column}'; the file's columns are: {has}")
    if label_column is not None and label_column not in names:
        raise DataError(f"{f}: no label column '{label_column}'; the file's columns are: {has}")
    if label_column == id_column:
        raise DataError(f"{f}: column '{id_column}' cannot be both the id and the label")
    if columns is None:
        return [c for c in names if c not in (id_column, label_column)]
    feats = list(columns)
    for c in feats:
        if c not in names:
            raise DataError(f"{f}: no feature column '{c}'; the file's columns are: {has}")
        if c in (id_column, label_column):
            raise DataError(f"{f}: column '{c}' is the {'id' if c == id_column else 'label'}, not a feature")
        if feats.count(c) > 1:
            raise DataError(f"{f}: feature column '{c}' asked for more than once")
    return feats


def _arrow():
    """pyarrow and its compute functions, imported only when a file is read."""
    import pyarrow as pa
    import pyarrow.compute as pc

    return pa, pc


def _decoded(col):
    pa, pc = _arrow()
    return pc.cast(col, col.type.value_type) if pa.types.is_dictionary(col.type) else col


def _is_text(col) -> bool:
    pa, _ = _arrow()
    return pa.types.is_string(col.type) or pa.types.is_large_string(col.type)


def _read_ids(f: str, col, name: str) -> np.ndarray:
    pa, pc = _arrow()
    col = _decoded(col)
    if pa.types.is_integer(col.type):
        col = pc.cast(col, pa.string())
    elif not _is_text(col):
        raise DataError(f"{f}: column '{name}' holds {col.type}; ids must be strings or integers")
    empty = pc.fill_null(pc.utf8_length(col), 0).to_numpy() == 0
    if empty.any():
        raise DataError(f"{f}: column '{name}' row {int(np.argmax(empty)) + 1}: empty id")
    ids = col.to_numpy(zero_copy_only=False).astype(str)
    if len(pc.unique(col)) < len(ids):
        seen: dict[str, int] = {}
        for r, i in enumerate(ids.tolist()):
            if i in seen:
                raise DataError(f"{f}: column '{name}': id '{i}' appears twice (rows {seen[i] + 1} and {r + 1})")
            seen[i] = r
    return ids


def _at(f: str, column: str, row: int, ids: np.ndarray) -> str:
    return f"{f}: column '{column}' row {row + 1} (id '{ids[row]}')"


def _numbers(f: str, col, name: str, ids: np.ndarray) -> np.ndarray:
    """A column as float64, NaN where a value is missing; refuses a cell that is not a finite number."""
    pa, pc = _arrow()
    col = _decoded(col)
    t = col.type
    if pa.types.is_null(t):
        return np.full(len(col), np.nan)
    if _is_text(col):
        text = col.to_numpy(zero_copy_only=False)
        values = np.full(len(text), np.nan)
        given = np.flatnonzero(~np.isin(np.where(pc.is_null(col).to_numpy(zero_copy_only=False), "", text), _NULLS))
        try:
            values[given] = text[given].astype(str).astype(np.float64)
        except ValueError:
            for r in given.tolist():
                try:
                    float(text[r])
                except ValueError:
                    raise DataError(f"{_at(f, name, r, ids)}: {text[r]!r} is not a number") from None
            raise DataError(f"{f}: column '{name}' holds text that is not all numbers") from None
    elif pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t):
        values = pc.fill_null(pc.cast(col, pa.float64()), np.nan).to_numpy()
    else:
        r = int(np.argmin(pc.is_null(col).to_numpy(zero_copy_only=False)))
        raise DataError(f"{_at(f, name, r, ids)}: {str(col[r])!r} is not a number (the column holds {t})")
    inf = np.isinf(values)
    if inf.any():
        r = int(np.argmax(inf))
        raise DataError(f"{_at(f, name, r, ids)}: {values[r]} is not a finite number")
    return values


def _read_labels(f: str, col, name: str, ids: np.ndarray, kind: str) -> tuple[np.ndarray, tuple[str, ...]]:
    _, pc = _arrow()
    col = _decoded(col)
    if _is_text(col) and kind != "regression":
        empty = pc.fill_null(pc.utf8_length(col), 0).to_numpy() == 0
        if empty.any():
            raise DataError(f"{_at(f, name, int(np.argmax(empty)), ids)}: missing label (labels are never filled)")
        classes, y = np.unique(col.to_numpy(zero_copy_only=False).astype(str), return_inverse=True)
        return y.astype(np.int64).reshape(-1), tuple(classes.tolist())
    values = _numbers(f, col, name, ids)
    if np.isnan(values).any():
        r = int(np.argmax(np.isnan(values)))
        raise DataError(f"{_at(f, name, r, ids)}: missing label (labels are never filled)")
    whole = values == np.round(values)
    if kind == "regression" or (kind == "auto" and not whole.all()):
        return values.astype(np.float32).reshape(-1, 1), ()
    if not whole.all():
        r = int(np.argmin(whole))
        raise DataError(f"{_at(f, name, r, ids)}: label {values[r]} is not a class id (a whole number 0, 1, ...)")
    if (values < 0).any():
        r = int(np.argmax(values < 0))
        raise DataError(f"{_at(f, name, r, ids)}: label {values[r]:g} is negative; class ids start at 0")
    return values.astype(np.int64), ()


def _fill(f: str, X: np.ndarray, feats: list[str], ids: np.ndarray, missing: str) -> np.ndarray | None:
    """Treats the missing (NaN) values of X in place as ``missing`` says; returns the rows to keep for 'drop'."""
    gaps = np.isnan(X)
    if not gaps.any():
        return None
    if missing == "refuse":
        r = int(np.argmax(gaps.any(axis=1)))
        raise DataError(f"{_at(f, feats[int(np.argmax(gaps[r]))], r, ids)}: missing value; missing='refuse' (the "
                        f"default) stops here, 'drop' leaves such rows out, 'mean' or 'zero' fills them")
    if missing == "drop":
        keep = ~gaps.any(axis=1)
        if not keep.any():
            raise DataError(f"{f}: every row misses a feature value; missing='drop' leaves no row")
        return keep
    if missing == "zero":
        X[gaps] = 0.0
        return None
    counts = (~gaps).sum(axis=0)
    if (counts == 0).any():
        raise DataError(f"{f}: column '{feats[int(np.argmin(counts))]}' has no value to take the mean of")
    means = np.where(gaps, 0.0, X).sum(axis=0) / counts
    X[gaps] = np.broadcast_to(means, X.shape)[gaps]
    return None


def standardise(train: np.ndarray, *others: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each feature (every position but axis 0) centred and scaled by the train rows' mean and standard deviation
    (sd 0 -> 1); returns (train, *others) standardised. A party's own columns only: needs nothing of the others."""
    train = np.asarray(train, dtype=np.float64)
    if train.ndim < 1 or len(train) == 0:
        raise DataError("standardise: needs at least one train row")
    mean = train.mean(axis=0)
    sd = np.where(train.max(axis=0) == train.min(axis=0), 1.0, train.std(axis=0))
    out = [(train - mean) / sd]
    for o in others:
        o = np.asarray(o, dtype=np.float64)
        if o.shape[1:] != train.shape[1:]:
            raise DataError(f"standardise: rows of shape {o.shape[1:]} do not match the train rows' {train.shape[1:]}")
        out.append((o - mean) / sd)
    return tuple(out)
