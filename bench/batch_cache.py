"""Batches saved to disk and replayed: the views' own cost, apart from the
decoder's.

Until the compiled core produces batches, the Python twin makes them at
about 1 M instructions/s -- far too slow to time a view over a
150 M-instruction recording end to end.  ``save`` decodes a bundle's
streams once (any producer) into a directory: per stream the BLOCK records
(``NAME.blocks.npy``), the items (pickled, with their batch positions) and
the batch boundaries; ``load`` gives back a ``TraceSet`` whose streams
yield exactly those batches (``Stream.batches`` replaced), so a view runs
on them as on a live decode.

    python bench/batch_cache.py save BUNDLE CACHE_DIR
"""

from __future__ import annotations

import os
import pickle
import sys
import time

import numpy as np


def save(bundle: str, out: str, impl: str | None = None) -> dict:
    from hwtrace.streams import open_bundle
    os.makedirs(out, exist_ok=True)
    ts = open_bundle(bundle)
    info = {}
    for st in ts.streams:
        t0 = time.perf_counter()
        blocks, items, bounds, firsts = [], [], [], []
        n = 0
        for b in st.batches(view=True, impl=impl):
            blocks.append(b.blocks)
            items.append(b.items)
            bounds.append(n)
            firsts.append(b.first_insn)
            n += len(b.blocks)
        arr = np.concatenate(blocks) if blocks else np.zeros(0, blocks_dtype())
        np.save(os.path.join(out, st.name + ".blocks.npy"), arr)
        with open(os.path.join(out, st.name + ".items.pickle"), "wb") as f:
            pickle.dump({"items": items, "bounds": bounds, "firsts": firsts}, f)
        info[st.name] = {"records": n, "insns": int(arr["ninsn"].sum()),
                         "seconds": time.perf_counter() - t0}
        print(st.name, info[st.name], file=sys.stderr)
    return info


def blocks_dtype():
    from hwtrace.flow.batches import BLOCK
    return BLOCK


def cached_batches(cache: str, name: str):
    """The saved batches of stream ``name``, read batch by batch (not
    mapped: mapped pages would count in the view's RSS)."""
    from hwtrace.flow.batches import BLOCK, Batch
    path = os.path.join(cache, name + ".blocks.npy")
    with open(path, "rb") as f:
        version = np.lib.format.read_magic(f)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) \
            else np.lib.format.read_array_header_2_0
        shape, _order, _dt = read(f)
        base = f.tell()
    d = _blobs(cache, name)
    bounds = d["bounds"] + [shape[0]]
    with open(path, "rb") as f:
        for k, blob in enumerate(d["items"]):
            n = bounds[k + 1] - bounds[k]
            f.seek(base + bounds[k] * BLOCK.itemsize)
            blocks = np.fromfile(f, BLOCK, n)
            yield Batch(blocks, None, pickle.loads(blob), d["firsts"][k])


def _blobs(cache: str, name: str) -> dict:
    """The items of each batch, pickled one batch apiece (made from the
    saved items once): a batch's items become objects only when it is
    replayed, as a decoder would make them."""
    path = os.path.join(cache, name + ".items.blobs.pickle")
    if not os.path.exists(path):
        with open(os.path.join(cache, name + ".items.pickle"), "rb") as f:
            d = pickle.load(f)
        d["items"] = [pickle.dumps(x) for x in d["items"]]
        with open(path + ".tmp", "wb") as f:
            pickle.dump(d, f)
        os.replace(path + ".tmp", path)
    with open(path, "rb") as f:
        return pickle.load(f)


def load(bundle: str, cache: str):
    """``open_bundle(bundle)`` whose streams replay the cached batches."""
    from hwtrace.streams import open_bundle
    ts = open_bundle(bundle)
    for st in ts.streams:
        if not os.path.exists(os.path.join(cache, st.name + ".blocks.npy")):
            raise SystemExit(f"{cache}: no cached batches of {st.name}")

        def batches(*a, _name=st.name, **kw):
            return cached_batches(cache, _name)
        st.batches = batches
    return ts


if __name__ == "__main__":
    if len(sys.argv) < 4 or sys.argv[1] != "save":
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    save(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else None)
