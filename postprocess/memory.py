#!/usr/bin/env python3
"""Per-rank model-state memory of runs, measured, next to the ZeRO paper's formula.

Reads RUN_DIR/metrics.jsonl of each run (the "run" record's memory accounting and num_params, the
"train" records' mem_model_states_bytes); writes memory.csv, memory.md and memory.png (measured
against formula per run, stacked by params / grads / optimizer, buffers beside) into --out.
"""
import argparse
from pathlib import Path

# metrics first: it checks that pandas and matplotlib are there and selects the Agg backend.
from metrics import MetricsError, load_run, main, markdown_table
import matplotlib.pyplot as plt
import pandas as pd


# Bytes per parameter of (params, grads, optimizer state) before partitioning
# (ZeRO, Rajbhandari et al. 2020, sec. 3.1 and fig. 1).
BYTES_PER_PARAM = {
    "fp32": (4, 4, 8),   # fp32 weights and gradients; Adam m and v
    "fp16": (2, 2, 12),  # 16-bit weights and gradients; fp32 master weights, m and v
    "bf16": (2, 2, 12),
}
PARTS = ("params", "grads", "optimizer")

DEFINITIONS = """\
measured        rank 0's bytes from the "run" record: mem_params_bytes, mem_grads_bytes,
                mem_optimizer_bytes (their sum: states) and mem_buffers_bytes (communication
                and gather buffers). max_rank_total: the train records' mem_model_states_bytes,
                the largest params + grads + optimizer + buffers of any rank.
formula         the ZeRO paper's per-rank model states, with Psi = num_params of the "run"
                record (rank 0's share: its tensor-parallel slice of its pipeline stage), N = dp:
                  fp32:        params 4 Psi, grads 4 Psi, optimizer  8 Psi (Adam m, v)
                  fp16 / bf16: params 2 Psi, grads 2 Psi, optimizer 12 Psi (fp32 master, m, v)
                ZeRO stage >= 1 divides the optimizer by N, stage >= 2 also the grads, stage 3
                also the params.
ratio           measured states / formula states. Above 1 by the padding of the flat buffers
                (every bucket a multiple of dp x 16 elements) and, with ZeRO-3, by the tensors
                kept whole on every rank (persistent_params, under
                stage3_param_persistence_threshold). Buffers are not in the formula.
"""


def formula(psi: int, dp: int, stage: int, precision: str) -> dict:
    """The ZeRO paper's per-rank bytes of params, grads and optimizer state."""
    p, g, o = (b * psi for b in BYTES_PER_PARAM[precision])
    return {"params": p / (dp if stage >= 3 else 1), "grads": g / (dp if stage >= 2 else 1),
            "optimizer": o / (dp if stage >= 1 else 1)}


def memory_row(run_dir: str) -> dict:
    """One run's measured bytes (of its last segment, after a resume) and the formula's."""
    r = load_run(run_dir)
    run = r.run
    if run["precision"] not in BYTES_PER_PARAM:
        raise MetricsError(f"{Path(run_dir) / 'metrics.jsonl'}: precision \"{run['precision']}\" is not one of "
                           + ", ".join(BYTES_PER_PARAM))
    row = {"run": r.name, "ranks": run["world_size"], "tp": run["tp"], "pp": run["pp"], "dp": run["dp"],
           "zero_stage": run["zero_stage"], "precision": run["precision"], "psi": run["num_params"],
           "persistent_params": run["num_params_resident"]}
    row.update({f"measured_{k}": run[f"mem_{k}_bytes"] for k in PARTS})
    row["measured_states"] = sum(row[f"measured_{k}"] for k in PARTS)
    row["measured_buffers"] = run["mem_buffers_bytes"]
    row["max_rank_total"] = r.last_segment.mem_model_states_bytes.max()  # NaN without steps
    row.update({f"formula_{k}": v for k, v in formula(run["num_params"], run["dp"], run["zero_stage"],
                                                      run["precision"]).items()})
    row["formula_states"] = sum(row[f"formula_{k}"] for k in PARTS)
    row["ratio"] = row["measured_states"] / row["formula_states"]
    return row


def plot(table: pd.DataFrame, path: Path) -> int:
    """memory.png: per run a measured and a formula bar stacked by part, and a buffers bar; returns the bars drawn."""
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(table) + 2), 5))
    colors = {"params": "tab:blue", "grads": "tab:orange", "optimizer": "tab:green"}
    mib, width, bars = 2.0**20, 0.27, 0
    for i, row in enumerate(table.itertuples()):
        for offset, source, hatch in ((-width, "measured", None), (0.0, "formula", "//")):
            bottom = 0.0
            for k in PARTS:
                height = getattr(row, f"{source}_{k}") / mib
                ax.bar(i + offset, height, width, bottom=bottom, color=colors[k], hatch=hatch, edgecolor="white",
                       label=f"{k} ({source})" if i == 0 else None)
                bottom += height
            bars += 1
        ax.bar(i + width, row.measured_buffers / mib, width, color="tab:grey",
               label="buffers (measured)" if i == 0 else None)
        bars += 1
    ax.set_xticks(range(len(table)), [f"{r.run}\n{r.precision} stage {r.zero_stage}\ndp {r.dp} tp {r.tp} pp {r.pp}"
                                      for r in table.itertuples()], fontsize=8)
    ax.set(ylabel="MiB per rank (rank 0)",
           title="Model-state memory per rank: measured (left), ZeRO formula (hatched), buffers (right)")
    ax.title.set_fontsize(10)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never over a bar
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return bars


def write_markdown(table: pd.DataFrame, path: Path):
    mib = lambda b: f"{b / 2**20:.3f}"  # noqa: E731
    md = pd.DataFrame({"run": table.run, "ranks": table.ranks, "dp": table.dp, "tp": table.tp, "pp": table.pp,
                       "stage": table.zero_stage, "precision": table.precision, "Psi": table.psi})
    for k in PARTS + ("states",):
        md[f"{k} measured"] = table[f"measured_{k}"].map(mib)
        md[f"{k} formula"] = table[f"formula_{k}"].map(mib)
    md["measured / formula"] = table.ratio.map("{:.4f}".format)
    md["buffers"] = table.measured_buffers.map(mib)
    md["max rank total"] = table.max_rank_total.map(mib)
    path.write_text("# Model-state memory per rank (MiB, rank 0)\n\n" + markdown_table(md)
                    + f"\n## Definitions\n\n```\n{DEFINITIONS}```\n")


def run():
    parser = argparse.ArgumentParser(description=__doc__, epilog="definitions:\n" + DEFINITIONS,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", metavar="RUN_DIR", nargs="+", help="run directories (with a metrics.jsonl)")
    parser.add_argument("--out", metavar="DIR", default=".", help="where to write memory.{csv,md,png} (default: .)")
    args = parser.parse_args()
    table = pd.DataFrame([memory_row(d) for d in args.run_dirs])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    table.to_csv(out / "memory.csv", index=False)
    write_markdown(table, out / "memory.md")
    bars = plot(table, out / "memory.png")
    for name in ("memory.csv", "memory.md"):
        print(f"wrote {out / name}")
    print(f"wrote {out / 'memory.png'} ({len(table)} runs, {bars} bars)")


if __name__ == "__main__":
    main(run)
