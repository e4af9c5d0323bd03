"""Keys and global row ids: an md5 is its own key, other values are digested, MinHash bands are keyed
one by one, ids sort in input order and unpack to (shard, row)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from data_juicer_elastic.dedup import keys


def test_an_md5_hex_is_its_own_key_and_other_strings_are_digested():
    md5 = hashlib.md5(b"text").hexdigest()
    (key,) = keys.exact_keys([md5])[:, 0]
    assert bytes.fromhex(f"{int(key[0]):016x}{int(key[1]):016x}") == bytes.fromhex(md5)
    other = keys.exact_keys(["EMPTY", "EMPTY", "x" * 32, md5.upper()])
    assert (other[0] == other[1]).all() and not (other[0] == other[2]).all()
    assert (other[3] == keys.exact_keys([md5])[0]).all()


def test_minhash_bands_are_keyed_one_by_one():
    found = keys.minhash_keys([[b"a", b"b"], [b"a", b"c"], [b"b", b"a"]])
    assert found.shape == (3, 2, 2)
    assert (found[0, 0] == found[1, 0]).all() and not (found[0, 1] == found[1, 1]).all()
    with pytest.raises(ValueError, match="row 1 has 1 MinHash bands"):
        keys.minhash_keys([[b"a", b"b"], [b"a"]])


def test_global_row_ids_sort_in_input_order_and_unpack():
    ids = np.concatenate([keys.global_rows(0, 3), keys.global_rows(1, 2), keys.global_rows(7, 1)])
    assert (np.diff(ids.astype(np.float64)) > 0).all()
    assert keys.shard_of(ids).tolist() == [0, 0, 0, 1, 1, 7] and keys.row_of(ids).tolist() == [0, 1, 2, 0, 1, 0]
    with pytest.raises(ValueError, match="outside"):
        keys.global_rows(keys.MAX_SHARDS, 1)


def test_simhash_values_are_the_decimal_strings_the_operator_stores():
    assert keys.simhash_values(["18446744073709551615", "0", 5]).tolist() == [2**64 - 1, 0, 5]
