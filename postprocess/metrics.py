"""Reads what `zero3d train` writes into a run directory, for the other postprocess/ tools.

Reads RUN_DIR/metrics.jsonl (one JSON object per line, README "Outputs") and RUN_DIR/config.json
(the resolved config). load_run() gives the "run" record and the "train", "val" and "checkpoint"
records as pandas DataFrames; find_runs() lists the run directories under a study directory.
The lines are parsed by metrics_file.py, the one reader of metrics.jsonl.
A missing file or a malformed line raises MetricsError, one line naming the file (and line);
main() turns it into that line on stderr and exit code 2. Writes nothing.
"""
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from metrics_file import MetricsError, numbered  # MetricsError: the tools import it from here

try:
    import matplotlib
    import pandas as pd
except ImportError as e:  # e.g. a python3 first on PATH that is not Debian's
    sys.exit(f"{Path(sys.argv[0]).name}: error: no module {e.name}: apt-get install python3-pandas python3-matplotlib, "
             "or run the script with /usr/bin/python3")
matplotlib.use("Agg")  # files only, no display

# The fields the tools read; a record without one is an error naming the file, line and field.
REQUIRED = {
    "run": ("world_size", "dp", "tp", "pp", "zero_stage", "precision", "num_params", "num_params_resident",
            "flops_per_token", "train_batch_size", "seq_len", "start_step", "mem_params_bytes",
            "mem_grads_bytes", "mem_optimizer_bytes", "mem_buffers_bytes"),
    "train": ("step", "loss", "skipped", "tokens_per_s", "mfu", "mem_model_states_bytes"),
    "val": ("step", "loss"),
    "checkpoint": ("step", "action"),
}


@dataclass
class Run:
    path: Path          # the run directory
    run: dict           # the last "run" record: the layout of the last (or only) segment
    runs: list          # every "run" record: one per start, and one more per resume into this run dir
    train: pd.DataFrame  # one row per step, by step; column "segment" indexes `runs`
    val: pd.DataFrame
    checkpoint: pd.DataFrame  # saves and loads (action "save" / "load"), in file order
    config: dict        # RUN_DIR/config.json (the resolved config of the last segment), {} if absent

    @property
    def name(self) -> str:
        """The run directory's name ("." resolved)."""
        return self.path.resolve().name

    @property
    def last_segment(self) -> pd.DataFrame:
        """The train records written under self.run (after a resume: the steps after it)."""
        return self.train[self.train.segment == len(self.runs) - 1]


def load_run(run_dir) -> Run:
    """Reads RUN_DIR/metrics.jsonl and RUN_DIR/config.json."""
    path = Path(run_dir) / "metrics.jsonl"
    records = {kind: [] for kind in REQUIRED}
    for n, r in numbered(path):
        kind = r.get("kind")
        if kind not in REQUIRED:
            continue  # kinds from newer versions
        missing = [k for k in REQUIRED[kind] if k not in r]
        if missing:
            raise MetricsError(f"{path}:{n}: \"{kind}\" record without {', '.join(missing)}")
        if kind != "run":
            r["segment"] = len(records["run"]) - 1
        records[kind].append(r)
    if not records["run"]:
        raise MetricsError(f"{path}: no \"run\" record")
    frames = {k: pd.DataFrame(v, columns=None if v else list(REQUIRED[k]) + ["segment"])
              for k, v in records.items() if k != "run"}
    # A resume into the same run dir drops the records after the checkpoint's step first, so every
    # step is there once; keep the last should an older file repeat one.
    for k in ("train", "val"):
        frames[k] = frames[k].drop_duplicates("step", keep="last").sort_values("step", ignore_index=True)
    config_path = Path(run_dir) / "config.json"
    try:
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    except json.JSONDecodeError as e:
        raise MetricsError(f"{config_path}: not valid JSON: {e}")
    return Run(Path(run_dir), records["run"][-1], records["run"], frames["train"], frames["val"],
               frames["checkpoint"], config)


def find_runs(study_dir) -> list:
    """Every directory under study_dir (recursively, itself included) that has a metrics.jsonl."""
    study = Path(study_dir)
    if not study.is_dir():
        raise MetricsError(f"{study}: no such directory")
    runs = sorted(p.parent for p in study.rglob("metrics.jsonl"))
    if not runs:
        raise MetricsError(f"{study}: no run directory (with a metrics.jsonl) under it")
    return runs


def markdown_table(df: pd.DataFrame) -> str:
    """A Markdown table of df's columns, its values as str() gives them (format them first)."""
    rows = [list(df.columns), ["---"] * df.shape[1]] + df.astype(str).values.tolist()
    return "".join("| " + " | ".join(r) + " |\n" for r in rows)


def main(fn):
    """Runs fn(); a MetricsError becomes one line on stderr and exit code 2."""
    try:
        fn()
    except MetricsError as e:
        print(f"{Path(sys.argv[0]).name}: error: {e}", file=sys.stderr)
        sys.exit(2)
