"""tests/cli/z3dcheck.py: what the CLI tests' Python checks share, written once.

common.sh puts tests/cli on PYTHONPATH, so a check in a test script starts with
`from z3dcheck import ...` (`/usr/bin/python3 - ARGS <<'PY'` or `-c`).

Records of a run (postprocess/metrics_file.py: the repository's one reader of metrics.jsonl).
A run is RUN_DIR, or a path ending in .jsonl:
  records(run, kind=None)   every record, or those of one kind, in file order
  run_record(run)           the first "run" record (the start's layout and accounting)
  train(run)                the "train" records
  run_and_train(run)        both, from one read: (the first "run" record, the "train" records)
  by_step(run, *keys)       {step: (the train record's keys...)}
  read_jsonl(path)          any JSON-lines file (`zero3d plan --json`)
  MEASURED                  train fields that are measurements, not state: they differ run to run
  without(r, keys)          r less those keys

Comparing:
  rel(a, b)                 |a - b| / |b|
  max_rel(a, b, key)        the largest rel over records zipped in order (key "loss" by default)
  Checks(name)              counts checks; a failed one prints "FAIL what"; exit() ends the script

Files:
  dataset_extent(path, name)      (offset, size) of a contiguous HDF5 dataset's bytes in the file
  xor_bytes(path, at, n, mask)    flips n bytes at `at` in place (a damaged file)
  dataset_names(h5)               every dataset's path in an open h5py file, in visit order
  read_safetensors(path)          a .safetensors file's parts, parsed (see Safetensors)
  f32_tensors(path)               its tensors as float32 numpy arrays (writable copies), by name; every
                                  one must be F32 (a ValueError names the first that is not)
"""
import json
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "postprocess"))
from metrics_file import MetricsError, read_jsonl, records  # noqa: E402,F401  (re-exported)

MEASURED = frozenset({"tokens_per_s", "step_time_s", "model_flops_per_s", "mfu", "page_faults"})


def run_record(run):
    return records(run, "run")[0]


def train(run):
    return records(run, "train")


def run_and_train(run):
    recs = records(run)
    return next(r for r in recs if r["kind"] == "run"), [r for r in recs if r["kind"] == "train"]


def by_step(run, *keys):
    return {r["step"]: tuple(r[k] for k in keys) for r in train(run)}


def without(r, keys):
    return {k: v for k, v in r.items() if k not in keys}


def rel(a, b):
    return abs(a - b) / abs(b)


def max_rel(a, b, key="loss"):
    return max(rel(x[key], y[key]) for x, y in zip(a, b))


class Checks:
    """Counts the checks of a script. check(ok, what) prints "FAIL what" when not ok and returns ok;
    exit() prints "NAME: P passed, F failed" (when named) and exits 1 if any failed, else 0."""

    def __init__(self, name=None):
        self.name, self.passed, self.failed = name, 0, 0

    def __call__(self, ok, what):
        if ok:
            self.passed += 1
        else:
            self.failed += 1
            print("FAIL", what)
        return ok

    def fail(self, what):
        self(False, what)

    def exit(self):
        if self.name:
            print(f"{self.name}: {self.passed} passed, {self.failed} failed")
        sys.exit(1 if self.failed else 0)


def dataset_extent(path, name):
    import h5py
    with h5py.File(path, "r") as f:
        return f[name].id.get_offset(), f[name].id.get_storage_size()


def xor_bytes(path, at, n, mask):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(n)
        f.seek(at)
        f.write(bytes(x ^ mask for x in b))


def dataset_names(h5):
    import h5py
    names = []
    h5.visititems(lambda n, v: names.append(n) if isinstance(v, h5py.Dataset) else None)
    return names


@dataclass
class Safetensors:
    header_len: int   # the JSON header's length in bytes (the file's first 8 bytes, little-endian)
    tensors: dict     # name -> {"dtype", "shape", "data_offsets"}, in file order; no "__metadata__"
    metadata: dict    # "__metadata__", or {} when the file has none
    data: bytes       # everything after the header; data_offsets index it


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    tensors = json.loads(raw[8:8 + n])
    metadata = tensors.pop("__metadata__", {})
    return Safetensors(n, tensors, metadata, raw[8 + n:])


def f32_tensors(path):
    import numpy as np
    st = read_safetensors(path)
    out = {}
    for name, t in st.tensors.items():
        if t["dtype"] != "F32":
            raise ValueError(f"{path}: {name} is {t['dtype']}, not F32")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(st.data[a:b], dtype="<f4").reshape(t["shape"]).copy()
    return out


def check_resumes(check, name, uninterrupted, resumed, other_layout, steps, tol=1e-4):
    """A run resumed from a checkpoint of `uninterrupted` (run dirs): its steps (the last `steps`
    of the run) bitwise equal to the uninterrupted run's; `other_layout`, resumed from the same
    checkpoint on another layout, within `tol` relative. Prints one line; returns nothing."""
    ref = {r["step"]: without(r, MEASURED) for r in train(uninterrupted)}
    res = {r["step"]: without(r, MEASURED) for r in train(resumed)}
    last = max(ref)
    want = list(range(last - steps + 1, last + 1))
    check(sorted(ref) == list(range(1, last + 1)) and sorted(res) == want, f"{name}: steps {sorted(res)}, not {want}")
    bad = [k for k in res if res[k] != ref.get(k)]
    check(not bad, f"{name}: steps {bad} differ after resume: {[(ref.get(k), res[k]) for k in bad[:1]]}")
    other = train(other_layout)
    err = max_rel(other, [ref[r["step"]] for r in other])
    check(len(other) == steps and err <= tol, f"{name}: resumed on another layout, loss {err:.2e} relative")
    print(f"{name}: steps {want[0]}-{last} resumed bitwise; on another layout within {err:.1e}; "
          f"loss {ref[1]['loss']:.3f} -> {ref[last]['loss']:.3f}")
