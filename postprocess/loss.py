#!/usr/bin/env python3
"""Training loss against step of several runs on one plot.

Reads RUN_DIR/metrics.jsonl of each run ("train" records, with --val also "val" records, and
"checkpoint" loads); writes one PNG (--out, default loss.png). A resumed run is one continuous
curve (metrics.jsonl holds each step once); a dotted vertical line marks each resume.
"""
import argparse
from pathlib import Path

# metrics first: it checks that pandas and matplotlib are there and selects the Agg backend.
from metrics import load_run, main
import matplotlib.pyplot as plt


def run():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+",
                        help="run directories (with a metrics.jsonl); the curve is labelled by the directory name")
    parser.add_argument("--out", metavar="PNG", default="loss.png", help="the plot to write (default: loss.png)")
    parser.add_argument("--val", action="store_true", help="also mark the validation loss (\"val\" records)")
    args = parser.parse_args()
    runs = [load_run(d) for d in args.run_dirs]
    names = [r.name for r in runs]
    if len(set(names)) < len(names):  # two runs of one name in different studies: label by path
        names = [str(r.path) for r in runs]

    fig, ax = plt.subplots(figsize=(8, 5))
    train_points = val_points = resumes = 0
    for r, name in zip(runs, names):
        line, = ax.plot(r.train.step, r.train.loss, lw=1.2, label=name)
        train_points += len(r.train)
        for step in r.checkpoint[r.checkpoint.action == "load"].step:
            ax.axvline(step, color=line.get_color(), ls=":", lw=1)
            resumes += 1
        if args.val and len(r.val):
            ax.plot(r.val.step, r.val.loss, "o", color=line.get_color(), mfc="none", label=f"{name} (val)")
            val_points += len(r.val)
    ax.set(xlabel="step", ylabel="loss (mean over the global batch)",
           title="Training loss" + (" and validation loss (circles)" if args.val else "")
           + ("; dotted: resumed here" if resumes else ""))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    plt.close(fig)
    print(f"wrote {args.out} ({len(runs)} runs, {train_points} train points, {val_points} val points)")


if __name__ == "__main__":
    main(run)
