"""A vertical party's own table: reading CSV and Parquet with strict checks, Table's own checks, standardise."""

import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sluice.errors import DataError
from sluice.tasks.table import Table, read_table, standardise


def csv(tmp_path, text, name="party.csv"):
    path = tmp_path / name
    path.write_text(text)
    return path


def parquet(tmp_path, columns, name="party.parquet"):
    path = tmp_path / name
    pq.write_table(pa.table(columns), path)
    return path


def refused(match, *args, **kwargs):
    """The DataError read_table raises, checked to be one line that matches ``match``."""
    with pytest.raises(DataError, match=match) as e:
        read_table(*args, **kwargs)
    assert "\n" not in str(e.value)
    return str(e.value)


# ---- reading: files, ids, features

def test_csv_ids_are_the_strings_written_and_features_float64(tmp_path):
    t = read_table(csv(tmp_path, "id,age,score\n007,30,1.5\n7,40,-2\nu3,50,0\n"))
    assert t.ids.tolist() == ["007", "7", "u3"] and t.ids.dtype.kind == "U"
    assert t.X.dtype == np.float64 and t.X.tolist() == [[30, 1.5], [40, -2], [50, 0]]
    assert t.columns == ("age", "score") and t.name == "party.csv"
    assert t.y is None and t.kind is None and t.test is None and t.classes == ()


def test_columns_picks_and_orders_the_features(tmp_path):
    t = read_table(csv(tmp_path, "a,id,b,c\n1,x,2,3\n4,y,5,6\n"), columns=["c", "a"])
    assert t.columns == ("c", "a") and t.X.tolist() == [[3, 1], [6, 4]]


def test_parquet_integer_ids_booleans_and_dictionary_columns(tmp_path):
    path = parquet(tmp_path, {"id": pa.array([7, 8, 10], pa.int64()), "flag": [True, False, True],
                              "n": pa.array([1, 2, 3], pa.int32()),
                              "colour": pa.array(["1.5", "2", "3"]).dictionary_encode()}, name="p.pq")
    t = read_table(path)
    assert t.ids.tolist() == ["7", "8", "10"]
    assert t.X.tolist() == [[1, 1, 1.5], [0, 2, 2], [1, 3, 3]]


def test_unknown_suffix_and_missing_file(tmp_path):
    msg = refused("unknown file type '.txt'", csv(tmp_path, "id\n1\n", name="a.txt"))
    assert ".csv" in msg and ".parquet" in msg and ".pq" in msg
    assert str(tmp_path / "nope.csv") in refused("no such file", tmp_path / "nope.csv")


def test_unreadable_files_are_one_line_errors(tmp_path):
    refused("empty.csv: cannot be read: Empty CSV file", csv(tmp_path, "", name="empty.csv"))
    refused("ragged.csv: cannot be read: .*Expected 2 columns", csv(tmp_path, "id,a\n1,2\n3\n", name="ragged.csv"))
    refused("bad.parquet: cannot be read", csv(tmp_path, "id,a\n1,2\n", name="bad.parquet"))


def test_id_column_must_exist_and_the_error_lists_the_columns(tmp_path):
    refused(r"party.csv: no id column 'id'; the file's columns are: key, a$", csv(tmp_path, "key,a\n1,2\n"))
    assert read_table(csv(tmp_path, "key,a\n1,2\n"), id_column="key").ids.tolist() == ["1"]


def test_empty_ids_are_refused(tmp_path):
    refused(r"party.csv: column 'id' row 2: empty id", csv(tmp_path, "id,a\nx,1\n,2\n"))
    refused(r"p.parquet: column 'id' row 1: empty id", parquet(tmp_path, {"id": [None, "b"], "a": [1, 2]}, "p.parquet"))
    refused(r"holds double; ids must be strings or integers", parquet(tmp_path, {"id": [1.0, 2.0]}))


def test_duplicate_ids_name_the_id_and_both_rows(tmp_path):
    path = csv(tmp_path, "id,a\na,1\nb,2\nc,3\nb,4\n")
    refused(r"party.csv: column 'id': id 'b' appears twice \(rows 2 and 4\)", path)


def test_header_names_repeated(tmp_path):
    refused("column 'a' appears more than once", csv(tmp_path, "id,a,a\n1,2,3\n"))


def test_asked_columns_must_exist_and_be_features(tmp_path):
    path = csv(tmp_path, "id,a,b,y\n1,2,3,0\n")
    assert "the file's columns are: id, a, b, y" in refused("no feature column 'zz'", path, columns=["a", "zz"])
    refused("column 'y' is the label, not a feature", path, label_column="y", columns=["a", "y"])
    refused("column 'id' is the id, not a feature", path, columns=["id"])
    refused("'a' asked for more than once", path, columns=["a", "a"])
    refused("cannot be both the id and the label", path, label_column="id")


def test_a_non_numeric_cell_names_column_row_id_and_value(tmp_path):
    path = csv(tmp_path, "id,age,b\nu1,3,1\nu2,,2\nu0042,abc,3\nu4,xyz,4\n", name="leader.csv")
    refused(r"/leader.csv: column 'age' row 3 \(id 'u0042'\): 'abc' is not a number$", path, missing="zero")
    path = csv(tmp_path, "id,when\na,2020-01-01\nb,2020-01-02\n")
    refused(r"column 'when' row 1 \(id 'a'\): '2020-01-01' is not a number \(the column holds date32", path)
    path = parquet(tmp_path, {"id": ["a", "b", "c"], "s": ["1", None, "x7"]})
    refused(r"column 's' row 3 \(id 'c'\): 'x7' is not a number", path, missing="zero")


def test_infinite_values_are_refused(tmp_path):
    refused(r"column 'a' row 2 \(id 'q'\): inf is not a finite number", csv(tmp_path, "id,a\np,1\nq,inf\n"))


def test_numbers_as_text_in_parquet_are_read(tmp_path):
    t = read_table(parquet(tmp_path, {"id": ["a", "b", "c"], "s": ["1.5", "NA", "-2"]}), missing="zero")
    assert t.X[:, 0].tolist() == [1.5, 0, -2]


# ---- missing feature values

MISSING = "id,a,b\nr1,1,10\nr2,,20\nr3,3,nan\nr4,5,NA\nr5,7,50\n"


def test_missing_values_are_refused_by_default_naming_the_settings(tmp_path):
    msg = refused(r"party.csv: column 'a' row 2 \(id 'r2'\): missing value", csv(tmp_path, MISSING))
    assert all(word in msg for word in ("'refuse'", "'drop'", "'mean'", "'zero'"))
    refused(r"column 'b' row 2 \(id 'y'\): missing value", parquet(tmp_path, {"id": ["x", "y"], "b": [1.0, np.nan]}))
    refused(r"column 'b' row 1 \(id 'x'\): missing value", parquet(tmp_path, {"id": ["x", "y"], "b": [None, 1]}))


def test_drop_leaves_the_rows_out(tmp_path):
    t = read_table(csv(tmp_path, "id,a,b,y\nr1,1,10,0\nr2,,20,1\nr3,3,nan,1\nr4,5,NA,0\nr5,7,50,1\n"),
                   label_column="y", missing="drop")
    assert t.ids.tolist() == ["r1", "r5"] and t.X.tolist() == [[1, 10], [7, 50]] and t.y.tolist() == [0, 1]
    with pytest.raises(DataError, match="2 of the 3 ids are not in party.csv"):
        t.rows(["r1", "r2", "r3"])


def test_mean_and_zero_fill(tmp_path):
    t = read_table(csv(tmp_path, MISSING), missing="mean")
    assert t.X[:, 0].tolist() == [1, 4, 3, 5, 7] and t.X[:, 1].tolist() == [10, 20, 80 / 3, 80 / 3, 50]
    assert read_table(csv(tmp_path, MISSING), missing="zero").X.tolist() == [[1, 10], [0, 20], [3, 0], [5, 0],
                                                                               [7, 50]]


def test_missing_settings_that_leave_nothing(tmp_path):
    refused("every row misses a feature value", csv(tmp_path, "id,a\nx,\ny,\n"), missing="drop")
    refused("column 'a' has no value to take the mean of", csv(tmp_path, "id,a,b\nx,,1\ny,,2\n"), missing="mean")
    assert read_table(csv(tmp_path, "id,a\nx,\ny,\n"), missing="zero").X.tolist() == [[0], [0]]


def test_bad_arguments(tmp_path):
    path = csv(tmp_path, "id,a\nx,1\n")
    refused("missing='fill'; allowed: refuse, drop, mean, zero", path, missing="fill")
    refused("label_kind='ordinal'; allowed", path, label_kind="ordinal")


def test_empty_tables_are_refused(tmp_path):
    refused("party.csv: no data rows", csv(tmp_path, "id,a,y\n"), label_column="y")
    refused("no data rows", parquet(tmp_path, {"id": pa.array([], pa.string())}))


def test_only_ids_and_labels_give_no_features(tmp_path):
    t = read_table(csv(tmp_path, "id,y\na,1\nb,0\n"), label_column="y")
    assert t.X.shape == (2, 0) and t.X.dtype == np.float64 and t.columns == ()
    assert read_table(csv(tmp_path, "id\na\nb\nc\n")).X.shape == (3, 0)


# ---- labels

def test_integer_labels_are_class_ids(tmp_path):
    t = read_table(csv(tmp_path, "id,a,y\na,1,2\nb,2,0\nc,3,1\n"), label_column="y")
    assert t.kind == "classification" and t.y.dtype == np.int64 and t.y.tolist() == [2, 0, 1]
    assert t.columns == ("a",) and t.classes == ()
    assert read_table(csv(tmp_path, "id,y\na,1.0\nb,3.0\n"), label_column="y").y.dtype == np.int64


def test_string_labels_become_sorted_classes(tmp_path):
    t = read_table(csv(tmp_path, "id,y\na,dog\nb,cat\nc,emu\nd,cat\n"), label_column="y")
    assert t.classes == ("cat", "dog", "emu") and t.y.tolist() == [1, 0, 2, 0] and t.kind == "classification"
    p = read_table(parquet(tmp_path, {"id": [1, 2], "y": pa.array(["b", "a"]).dictionary_encode()}), label_column="y")
    assert p.classes == ("a", "b") and p.y.tolist() == [1, 0]


def test_other_float_labels_are_regression_targets(tmp_path):
    t = read_table(csv(tmp_path, "id,y\na,1.5\nb,2\n"), label_column="y")
    assert t.kind == "regression" and t.y.dtype == np.float32 and t.y.shape == (2, 1) and t.y[:, 0].tolist() == [1.5, 2]


def test_label_kind_can_be_forced(tmp_path):
    path = csv(tmp_path, "id,y\na,1\nb,2\n")
    t = read_table(path, label_column="y", label_kind="regression")
    assert t.kind == "regression" and t.y.tolist() == [[1], [2]]
    refused(r"column 'y' row 2 \(id 'b'\): label 0.5 is not a class id",
            csv(tmp_path, "id,y\na,1\nb,0.5\n"), label_column="y", label_kind="classification")
    refused(r"column 'y' row 1 \(id 'a'\): 'cat' is not a number",
            csv(tmp_path, "id,y\na,cat\n"), label_column="y", label_kind="regression")
    t = read_table(csv(tmp_path, "id,y\na,x\nb,y\n"), label_column="y", label_kind="classification")
    assert t.classes == ("x", "y")


def test_bad_labels_are_refused(tmp_path):
    refused("party.csv: no label column 'target'; the file's columns are: id, y",
            csv(tmp_path, "id,y\na,1\n"), label_column="target")
    refused(r"column 'y' row 2 \(id 'b'\): label -1 is negative", csv(tmp_path, "id,y\na,1\nb,-1\n"), label_column="y")


@pytest.mark.parametrize("text", ["id,a,y\na,1,1\nb,2,\nc,3,0\n", "id,a,y\na,1,x\nb,2,\nc,3,z\n",
                                  "id,a,y\na,1,1.5\nb,2,NaN\nc,3,0\n"])
@pytest.mark.parametrize("missing", ["refuse", "mean", "drop"])
def test_missing_labels_are_never_filled(tmp_path, text, missing):
    refused(r"column 'y' row 2 \(id 'b'\): missing label", csv(tmp_path, text), label_column="y", missing=missing)


def test_null_labels_in_parquet(tmp_path):
    refused(r"column 'y' row 1 \(id 'a'\): missing label",
            parquet(tmp_path, {"id": ["a", "b"], "y": [None, 1]}), label_column="y")


# ---- Table, rows, standardise

def table(**kw):
    base = {"ids": np.array(["a", "b", "c"]), "X": np.zeros((3, 2))}
    return Table(**(base | kw))


def test_rows_gives_positions_in_the_order_asked():
    t = table(ids=np.array(["z", "a", "m"]), name="follower")
    assert t.rows(["m", "z", "a", "m"]).tolist() == [2, 0, 1, 2] and t.rows([]).dtype == np.int64
    with pytest.raises(DataError, match=r"^4 of the 5 ids are not in follower \(first: q, b, c\)$"):
        t.rows(["q", "a", "b", "c", "d"])
    with pytest.raises(DataError, match=r"1 of the 1 ids are not in table \(first: a\)"):
        table(ids=np.array([], dtype=str), X=np.zeros((0, 1))).rows(["a"])


@pytest.mark.parametrize(("kw", "match"), [
    ({"ids": np.array(["a", "b", "a"])}, r"id 'a' appears twice \(rows 1 and 3\)"),
    ({"ids": np.array(["a", "", "c"])}, "row 2 has an empty id"),
    ({"ids": np.array([1, 2, 3])}, "ids must be strings"),
    ({"ids": np.array([["a", "b", "c"]])}, "1-d array"),
    ({"X": np.zeros((2, 2))}, "X must be a float64 array of shape"),
    ({"X": np.zeros((3, 2), np.float32)}, "X must be a float64"),
    ({"X": np.zeros(3)}, "X must be a float64"),
    ({"y": np.array([0, 1])}, "labels must be an array of 3 rows"),
    ({"y": np.array([0, 1, 2], np.int32)}, "labels must be int64 class ids"),
    ({"y": np.array([0, -1, 2])}, "class id -1 is negative"),
    ({"y": np.array([0, 1, 2]), "classes": ("x", "y")}, "class id 2 but only 2 class names"),
    ({"y": np.zeros((3, 1), np.float32), "classes": ("x",)}, "class names given for regression"),
    ({"classes": ("x",)}, "classes given without labels"),
    ({"columns": ("a",)}, "1 column names for 2 features"),
    ({"columns": ("a", "a")}, "names repeated"),
    ({"test": np.array([True, False])}, r"test must be a bool array of shape \(3,\)"),
    ({"test": np.array([1, 0, 1])}, "test must be a bool array"),
])
def test_table_checks_itself(kw, match):
    with pytest.raises(DataError, match=match):
        table(**kw)


def test_a_valid_table():
    t = table(ids=np.array(["a", "b", "c"], dtype=object), X=np.zeros((3, 2, 2)), y=np.ones((3, 2), np.float32),
              columns=("p", "q", "r", "s"), test=np.array([False, True, False]))
    assert t.ids.dtype.kind == "U" and t.kind == "regression"
    assert table(y=np.array([0, 1, 1]), classes=("n", "y")).kind == "classification"


def test_standardise_uses_the_train_rows_only():
    train = np.array([[1.0, 5.0], [3.0, 5.0]])
    test = np.array([[5.0, 7.0]])
    s_train, s_test = standardise(train, test)
    assert s_train.tolist() == [[-1, 0], [1, 0]]
    assert s_test.tolist() == [[3, 2]]  # (5 - 2) / 1 and (7 - 5) / 1: the constant column's sd is taken as 1
    assert train.tolist() == [[1, 5], [3, 5]]  # not changed in place
    (only,) = standardise(np.arange(12.0).reshape(3, 2, 2))
    assert only.shape == (3, 2, 2) and np.allclose(only.mean(axis=0), 0) and np.allclose(only.std(axis=0), 1)


def test_standardise_refuses_what_does_not_fit():
    with pytest.raises(DataError, match="do not match"):
        standardise(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(DataError, match="at least one train row"):
        standardise(np.zeros((0, 3)))


def test_the_module_imports_no_torch():
    code = "import sys, sluice.tasks.table; assert 'torch' not in sys.modules and 'pyarrow' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
