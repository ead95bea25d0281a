"""postprocess/bench_stats.py: the statistics the benchmark scripts (jobscripts/*bench*.sh,
ckpt_*.sh) print, in one place: medians with their spread, and the records of a run directory.

  med(xs)                  the median
  spread(xs, fmt)          "median [min-max]" with fmt for each number
  records(run_dir, kind)   a run's metrics.jsonl records of one kind, in order (metrics_file.py's)
  train(run_dir, first=3)  its "train" records from step `first` on (steps 1-2 are warm-up)
  step_medians(run_dir, keys, first=3)   {key: median over those train records}

Only the standard library: the scripts run it with any python3.
"""
import statistics

from metrics_file import records  # noqa: F401  (the scripts import it from here)


def med(xs):
    return statistics.median(xs)


def spread(xs, fmt="{:.2f}"):
    xs = list(xs)
    return f"{fmt.format(med(xs))} [{fmt.format(min(xs))}-{fmt.format(max(xs))}]"


def train(run_dir, first=3):
    return [r for r in records(run_dir, "train") if r["step"] >= first]


def step_medians(run_dir, keys, first=3):
    rows = train(run_dir, first)
    return {k: med(r[k] for r in rows) for k in keys}
