#!/usr/bin/env python3
"""Strong- and weak-scaling table and plots of a study: the runs under one directory.

Reads every STUDY_DIR/**/metrics.jsonl (with its config.json) and the optional STUDY_DIR/study.json;
writes scaling.csv, scaling.md and scaling.png (throughput per rank, speedup, efficiency and MFU
against ranks) into --out (default STUDY_DIR), and prints their paths.
"""
import argparse
import json
import sys
from pathlib import Path

# metrics first: it checks that pandas and matplotlib are there and selects the Agg backend.
from metrics import MetricsError, find_runs, load_run, main, markdown_table
import matplotlib.ticker
import matplotlib.pyplot as plt
import pandas as pd

DEFINITIONS = """\
ranks              world_size of the run (dp x tp x pp); nodes: from study.json, else 1.
global batch       train_batch_size, sequences per step; per-replica batch = global batch / dp.
tokens/s           mean of the train records' tokens_per_s (global batch x seq_len / step time of
                   the slowest rank) over the steps after the first --skip (warm-up); a run with
                   --skip steps or fewer drops only its first step. Skipped (fp16 overflow) steps
                   count. After a resume into the same run dir, only the steps after the last
                   resume count.
tokens/s per rank  tokens/s / ranks.
MFU                mean over the same steps of mfu = model FLOPs/s / (peak FLOP/s per rank x ranks).
series             runs scaled together. From STUDY_DIR/study.json when it exists:
                     {"runs": [{"run": "<run dir relative to STUDY_DIR>", "mode": "strong" | "weak",
                                "nodes": N, "series": "<name, default: the mode>"}, ...]}
                   (list a run twice to put it in two series). Otherwise inferred: runs of one
                   model and precision with the same global batch form a strong series, with the
                   same per-replica batch a weak series; a series needs two rank counts or more.
                   A run can be in both (typically the single-rank base).
baseline           the series' run with the fewest ranks (ties: the highest tokens/s).
speedup            tokens/s / baseline tokens/s (ideal: ranks / baseline ranks).
efficiency         strong: speedup / (ranks / baseline ranks);
                   weak: tokens/s per rank / baseline tokens/s per rank. Ideal: 1.
"""

COLUMNS = ["series", "mode", "run", "nodes", "ranks", "tp", "pp", "dp", "zero_stage", "precision", "micro_batch",
           "global_batch", "per_replica_batch", "steps", "tokens_per_s", "tokens_per_s_per_rank", "mfu", "baseline",
           "speedup", "efficiency"]


def run_row(study: Path, run_dir: Path, skip: int):
    """One run's layout and its mean throughput and MFU over the measured steps; None without steps."""
    r = load_run(run_dir)
    steps = r.last_segment
    if len(steps) == 0:
        print(f"{Path(sys.argv[0]).name}: warning: {run_dir / 'metrics.jsonl'}: no train records; left out",
              file=sys.stderr)
        return None
    if len(steps) > skip:
        steps = steps.iloc[skip:]
    elif len(steps) > 1:
        steps = steps.iloc[1:]
    run = r.run
    tokens_per_s = steps.tokens_per_s.mean()
    return {"run": run_dir.relative_to(study).as_posix(), "nodes": 1, "ranks": run["world_size"],
            "tp": run["tp"], "pp": run["pp"], "dp": run["dp"], "zero_stage": run["zero_stage"],
            "precision": run["precision"], "micro_batch": r.config.get("train_micro_batch_size_per_gpu"),
            "global_batch": run["train_batch_size"], "per_replica_batch": run["train_batch_size"] // run["dp"],
            "model": (run["flops_per_token"], run["seq_len"]), "steps": len(steps), "tokens_per_s": tokens_per_s,
            "tokens_per_s_per_rank": tokens_per_s / run["world_size"], "mfu": steps.mfu.mean()}


def series_from_study_json(path: Path, runs: pd.DataFrame) -> list:
    """[(series name, mode, [run names])] from study.json; sets runs.nodes."""
    try:
        entries = json.loads(path.read_text())["runs"]
        groups = {}
        for e in entries:
            if e["run"] not in runs.index:
                raise MetricsError(f"{path}: run \"{e['run']}\" has no metrics.jsonl with train records "
                                   f"under {path.parent}")
            if e["mode"] not in ("strong", "weak"):
                raise MetricsError(f"{path}: run \"{e['run']}\": mode \"{e['mode']}\" is not \"strong\" or \"weak\"")
            runs.loc[e["run"], "nodes"] = int(e.get("nodes", 1))
            groups.setdefault((e.get("series", e["mode"]), e["mode"]), []).append(e["run"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise MetricsError(f"{path}: not a study file ({type(e).__name__}: {e}); see --help")
    return [(name, mode, members) for (name, mode), members in groups.items()]


def inferred_series(runs: pd.DataFrame) -> list:
    """[(series name, mode, [run names])]: same model, precision and global / per-replica batch."""
    several_models = runs.model.nunique() > 1
    out = []
    for mode, batch, what in (("strong", "global_batch", "global batch"),
                              ("weak", "per_replica_batch", "per-replica batch")):
        for (model, precision, b), g in runs.groupby(["model", "precision", batch], sort=True):
            if g.ranks.nunique() < 2:
                continue
            name = f"{mode}: {what} {b:g}, {precision}" + (f", {model[0]:.4g} FLOP/token" if several_models else "")
            out.append((name, mode, list(g.index)))
    return out


def scale(runs: pd.DataFrame, series: list) -> pd.DataFrame:
    """One row per (series, run) with baseline, speedup and efficiency; runs in no series once, without."""
    rows = []
    for name, mode, members in series:
        g = runs.loc[members].sort_values(["ranks", "tokens_per_s"], ascending=[True, False])
        base = g.iloc[0]
        g = g.assign(series=name, mode=mode, baseline=base.name,
                     speedup=g.tokens_per_s / base.tokens_per_s)
        if mode == "strong":
            g["efficiency"] = g.speedup / (g.ranks / base.ranks)
        else:
            g["efficiency"] = g.tokens_per_s_per_rank / base.tokens_per_s_per_rank
        rows.append(g)
    alone = runs.loc[[r for r in runs.index if not any(r in m for _, _, m in series)]]
    rows.append(alone.assign(series="", mode="", baseline="", speedup=float("nan"), efficiency=float("nan")))
    return pd.concat(rows).reset_index()[COLUMNS]


def plot(table: pd.DataFrame, path: Path) -> dict:
    """scaling.png: four axes against ranks; returns the number of points on each."""
    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    panels = [("tokens_per_s_per_rank", "tokens/s per rank", "Throughput per rank"),
              ("speedup", "speedup", "Speedup"), ("efficiency", "efficiency", "Scaling efficiency"),
              ("mfu", "MFU", "Model FLOPs utilization")]
    points = {}
    for ax, (col, ylabel, title) in zip(axes.flat, panels):
        points[col] = 0
        for name, g in table[table.series != ""].groupby("series", sort=False):
            g = g.sort_values("ranks")
            ax.plot(g.ranks, g[col], "o-", label=name)
            points[col] += len(g)
        if col == "speedup":  # log-log: the ideal speedup ranks / baseline ranks is a straight line
            for base in sorted(table[table.series != ""].groupby("series").ranks.min().unique()):
                ax.plot([base, table.ranks.max()], [1, table.ranks.max() / base], "--", color="black", lw=1,
                        label=f"ideal: ranks / {base}")
            ax.set_yscale("log", base=2)
            ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        alone = table[table.series == ""]
        if col in ("tokens_per_s_per_rank", "mfu") and len(alone):
            ax.plot(alone.ranks, alone[col], "s", color="grey", label="in no series")
            points[col] += len(alone)
        if col == "efficiency":
            ax.axhline(1.0, color="black", ls="--", lw=1, label="ideal")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(table.ranks.unique()), [str(r) for r in sorted(table.ranks.unique())])
        ax.set(xlabel="ranks", ylabel=ylabel, title=title)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return points


def write_markdown(table: pd.DataFrame, path: Path, skip: int):
    md = table.assign(
        tokens_per_s=table.tokens_per_s.map("{:.0f}".format),
        tokens_per_s_per_rank=table.tokens_per_s_per_rank.map("{:.1f}".format),
        speedup=table.speedup.map(lambda x: "" if pd.isna(x) else f"{x:.3f}"),
        efficiency=table.efficiency.map(lambda x: "" if pd.isna(x) else f"{x:.3f}"),
        mfu=table.mfu.map(lambda x: f"{100 * x:.2f}%"))
    md = md.rename(columns={"zero_stage": "stage", "micro_batch": "micro batch", "global_batch": "global batch",
                            "tokens_per_s": "tokens/s", "tokens_per_s_per_rank": "tokens/s per rank", "mfu": "MFU"})
    cols = ["run", "nodes", "ranks", "tp", "pp", "dp", "stage", "micro batch", "global batch", "tokens/s",
            "tokens/s per rank", "speedup", "efficiency", "MFU"]
    text = f"# Scaling\n\nMeans over the train steps after the first {skip} of each run.\n"
    for name, g in md.groupby("series", sort=False):
        heading = f"{name} (baseline {g.baseline.iloc[0]})" if name else "Runs in no series"
        shown = cols if name else [c for c in cols if c not in ("speedup", "efficiency")]
        text += f"\n## {heading}\n\n" + markdown_table(g[shown])
    text += f"\n## Definitions\n\n```\n{DEFINITIONS}```\n"
    path.write_text(text)


def run():
    parser = argparse.ArgumentParser(description=__doc__, epilog="definitions:\n" + DEFINITIONS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study_dir", metavar="STUDY_DIR",
                        help="the study: every directory under it (any depth) with a metrics.jsonl is a run")
    parser.add_argument("--out", metavar="DIR", help="where to write scaling.{csv,md,png} (default: STUDY_DIR)")
    parser.add_argument("--skip", metavar="N", type=int, default=2,
                        help="warm-up steps left out of the means (default 2)")
    args = parser.parse_args()
    study = Path(args.study_dir)
    rows = [row for d in find_runs(study) if (row := run_row(study, d, args.skip))]
    if not rows:
        raise MetricsError(f"{study}: no run under it has train records")
    runs = pd.DataFrame(rows).set_index("run")
    study_json = study / "study.json"
    series = series_from_study_json(study_json, runs) if study_json.is_file() else inferred_series(runs)
    table = scale(runs, series)

    out = Path(args.out or study)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "scaling.csv", index=False)
    write_markdown(table, out / "scaling.md", args.skip)
    points = plot(table, out / "scaling.png")
    print(f"scaling: runs {len(runs)}, series {len(series)} ({'study.json' if study_json.is_file() else 'inferred'})")
    for name in ("scaling.csv", "scaling.md"):
        print(f"wrote {out / name}")
    print(f"wrote {out / 'scaling.png'} (points per axis: "
          + ", ".join(f"{k} {v}" for k, v in points.items()) + ")")


if __name__ == "__main__":
    main(run)
