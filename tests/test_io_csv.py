"""`fbt_probe.io.write_csv` (pyarrow's writer) reads back like `DataFrame.to_csv` would.

Oracle: pandas' own writer. Both files are read with `pandas.read_csv` and compared value for value
and dtype for dtype: shortest round-trip floats lose nothing, so a float written with fewer digits
would differ at ~1e-17 relative and fail `equals`."""

import numpy as np
import pandas as pd

from fbt_probe.io import write_csv


def test_write_csv_reads_back_like_pandas(tmp_path):
    rng = np.random.default_rng(0)
    df = pd.DataFrame(
        {
            "row": np.arange(6),
            "task": ["completion", "memory", 'a "quoted", comma', "x", "", "ü"],
            "value": rng.standard_normal(6) * 10.0 ** rng.integers(-20, 20, 6),
            "normalized": [0.1, np.nan, 1 / 3, -0.0, 1e-300, 2.5],
            "tiny_gap": [True, False, True, False, False, True],
            "scale": [0.0, 0.5, 1.0, 2.0, 4.0, 0.0],
        }
    )
    write_csv(df, tmp_path / "fast.csv")
    df.to_csv(tmp_path / "pandas.csv", index=False)
    fast, slow = pd.read_csv(tmp_path / "fast.csv"), pd.read_csv(tmp_path / "pandas.csv")
    assert list(fast.dtypes) == list(slow.dtypes)
    pd.testing.assert_frame_equal(fast, slow, check_exact=True)
    assert (fast["value"].to_numpy() == df["value"].to_numpy()).all()


def test_write_csv_falls_back_to_pandas_for_list_columns(tmp_path):
    df = pd.DataFrame({"token_ids": [[1, 2], [3]], "n": [2, 1]})
    write_csv(df, tmp_path / "a.csv")
    df.to_csv(tmp_path / "b.csv", index=False)
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
