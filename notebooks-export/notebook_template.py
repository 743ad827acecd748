# The Python cells of the notebook that `kvevict export` writes (notebooks-export/notebook.cpp).
# Embedded into the binary at build time (cmake/embed_text.cmake); no file is read at run time.
# Each "# %% name" line starts the cell of that name; trailing blank lines are dropped.
# {{NAME}} is replaced by a Python literal from the C++ side, so the column lists have one
# source: TEXT_COLUMNS from the results column table, the *_SPLIT lists from svg_plot.cpp.

# %% setup
import io

import matplotlib

matplotlib.use("Agg")  # headless; figures are rendered to PNG and displayed explicitly
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Image, display


def show(fig):
    """Shows a figure as this cell's output whatever the backend, then frees it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buffer.getvalue()))

# %% load
TEXT_COLUMNS = {{TEXT_COLUMNS}}

# Read everything as text first so that names such as "NA" stay names, then convert
# the numeric columns; an empty field means "not applicable" and becomes NaN.
df = pd.read_csv(io.StringIO("\n".join(CSV_RECORDS) + "\n"), dtype=str, keep_default_na=False)
for column in df.columns:
    if column not in TEXT_COLUMNS:
        df[column] = pd.to_numeric(df[column].mask(df[column] == ""))
# A shared-context evaluation's per-turn rows sit beside its overall row (turn empty),
# which the figures draw.
if "turn" in df.columns:
    df = df[df["turn"].isna()]

df.groupby(["task", "metric", "policy"], sort=False).size().rename("rows").to_frame()

# %% helpers
# Settings that split a figure into several lines when they vary inside it.
# heavy_ratio / recent_ratio follow from budget x heavy_share, so they never split lines.
BUDGET_SPLIT = {{BUDGET_SPLIT}}
ABLATION_SPLIT = {{ABLATION_SPLIT}}
REFERENCE_POLICY = {{REFERENCE_POLICY}}  # drawn first


def text(value):
    """A setting as the CSV writes it: integers without '.0', blank when not applicable."""
    if isinstance(value, float):
        if value != value:
            return ""
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def varying(frame, columns):
    return [c for c in columns if frame[c].map(text).nunique() > 1]


def label(policy, columns, row):
    extras = ", ".join(f"{c}={text(row[c])}" for c in columns if text(row[c]))
    return f"{policy} ({extras})" if extras else policy


def add(series, key, policy, line_label, reference, x, row):
    entry = series.setdefault(
        key, {"policy": policy, "label": line_label, "reference": reference, "samples": []})
    entry["samples"].append((float(x), row["value"], row["stderr"]))


def finish(series, minimum_distinct_x):
    """Averages repeated x values; drops short lines; the full-cache baseline goes first."""
    lines = []
    for entry in series.values():
        samples = pd.DataFrame(entry["samples"], columns=["x", "y", "err"], dtype=float)
        samples = samples[np.isfinite(samples["x"]) & np.isfinite(samples["y"])]
        points = samples.groupby("x", sort=True).mean()
        if len(points) == 0 or len(points) < minimum_distinct_x:
            continue
        lines.append(dict(entry, points=points))
    lines.sort(key=lambda line: line["policy"] != REFERENCE_POLICY)  # stable: keeps first appearance
    return lines


def draw(lines, title, x_title, y_title):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, line in enumerate(lines):
        colour = f"C{i % 10}"
        points = line["points"]
        if line["reference"]:
            ax.axhline(points["y"].iloc[0], color=colour, linestyle="--", label=line["label"])
        else:
            err = points["err"] if points["err"].notna().any() else None
            ax.errorbar(points.index, points["y"], yerr=err, color=colour, marker="o",
                        capsize=3, label=line["label"])
    ax.set_title(title)
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    show(fig)

# %% budget
X_TITLES = {"budget": "KV budget (fraction of the sequence)", "budget_tokens": "KV budget (tokens)"}
plotted = 0
for (task, metric), group in df.groupby(["task", "metric"], sort=False):
    if group["budget"].notna().any():
        x_column = "budget"
    elif group["budget_tokens"].notna().any():
        x_column = "budget_tokens"
    else:
        print(f"{task} / {metric}: no budgeted rows, no figure")
        continue
    swept = group[group[x_column].notna()]
    baseline = group[group["budget"].isna() & group["budget_tokens"].isna()]
    swept_split, baseline_split = varying(swept, BUDGET_SPLIT), varying(baseline, BUDGET_SPLIT)
    series = {}
    for row in swept.to_dict("records"):
        key = ("swept", row["policy"]) + tuple(text(row[c]) for c in swept_split)
        add(series, key, row["policy"], label(row["policy"], swept_split, row), False,
            row[x_column], row)
    for row in baseline.to_dict("records"):
        key = ("baseline", row["policy"]) + tuple(text(row[c]) for c in baseline_split)
        add(series, key, row["policy"], label(row["policy"], baseline_split, row), True, 0.0, row)
    lines = finish(series, 1)
    if not any(not line["reference"] for line in lines):
        print(f"{task} / {metric}: no finite values, no figure")
        continue
    draw(lines, f"{task}: {metric} vs budget", X_TITLES[x_column], metric)
    plotted += 1
if plotted == 0:
    print("No budget sweeps in these results.")

# %% heavy_share
plotted = 0
for (task, metric), group in df.groupby(["task", "metric"], sort=False):
    ablation = group[group["heavy_share"].notna()]
    split = varying(ablation, ABLATION_SPLIT)
    series = {}
    for row in ablation.to_dict("records"):
        # The budget always names the line: the ablation reads "at budget B".
        budget_column = ("budget" if text(row["budget"]) else
                         "budget_tokens" if text(row["budget_tokens"]) else None)
        label_columns = ([budget_column] if budget_column else []) + split
        key = (row["policy"], text(row["budget"]), text(row["budget_tokens"]))
        key += tuple(text(row[c]) for c in split)
        add(series, key, row["policy"], label(row["policy"], label_columns, row), False,
            row["heavy_share"], row)
    lines = finish(series, 2)  # a line needs at least two heavy shares
    if not lines:
        continue
    draw(lines, f"{task}: {metric} vs heavy-hitter share", "heavy-hitter share of the budget",
         metric)
    plotted += 1
if plotted == 0:
    print("No heavy-share ablation in these results (no setting was run at several heavy shares).")
