"""The report's PNG plots, drawn from the report model: EM and F1 bars, document-norm histograms and recall@k curves
(matplotlib Agg, no pyplot)."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

from rag_mag import durable
from rag_mag.bench.report.model import ReportModel, finite, ordered_systems


def render_plots(model: ReportModel, out_dir: Path) -> list[Path]:
    """Every plot the model has data for, written into ``out_dir``; their paths."""
    plots = (plot_answers(model, out_dir / "em_f1.png"), plot_norms(model, out_dir / "document_norms.png"),
             plot_recall(model, out_dir / "recall_at_k.png"))
    return [plot for plot in plots if plot is not None]


def plot_answers(model: ReportModel, path: Path) -> Path | None:
    """EM and F1 per system and dataset with 95% CI bars (None: no system has answers)."""
    datasets = model.datasets
    systems = [system for system in model.systems if any(model.has(dataset, system, ["em"]) for dataset in datasets)]
    if not systems:
        return None
    figure = _figure(max(7.0, 0.45 * len(systems) * len(datasets) * 2 + 2), 4.2)
    width = 0.8 / len(systems)
    for position, metric in enumerate(("em", "f1")):
        axes = figure.add_subplot(1, 2, position + 1)
        for index, system in enumerate(systems):
            means, errors = [], [[], []]
            for dataset in datasets:
                cell = model.cell(dataset, system)
                mean = cell.means.get(metric, np.nan) if cell else np.nan
                low, high = cell.cis.get(metric, (mean, mean)) if cell else (np.nan, np.nan)
                means.append(mean)
                errors[0].append(max(mean - low, 0.0) if np.isfinite(mean) else 0.0)
                errors[1].append(max(high - mean, 0.0) if np.isfinite(mean) else 0.0)
            axes.bar(np.arange(len(datasets)) + index * width - 0.4 + width / 2, means, width, yerr=errors,
                     capsize=2, label=system)
        axes.set_xticks(np.arange(len(datasets)), datasets, rotation=20)
        axes.set_ylabel(f"{metric.upper()} (95% CI)")
        axes.set_title("Exact Match" if metric == "em" else "F1")
    handles, labels = axes.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=min(len(systems), 8), fontsize=8,
                  bbox_to_anchor=(0.5, -0.08))
    return _save(figure, path)


def plot_norms(model: ReportModel, path: Path) -> Path | None:
    """Histograms of the raw document norms of relevant and irrelevant passages per (dataset, system)."""
    norms = model.norms
    keys = [key for key in norms if len(norms[key].get("relevant", [])) and len(norms[key].get("irrelevant", []))]
    if not keys:
        return None
    datasets = list(dict.fromkeys(dataset for dataset, _ in keys))
    systems = ordered_systems([system for _, system in keys])
    figure = _figure(3.0 * len(systems), 2.4 * len(datasets))
    for row, dataset in enumerate(datasets):
        for column, system in enumerate(systems):
            if (dataset, system) not in norms:
                continue
            axes = figure.add_subplot(len(datasets), len(systems), row * len(systems) + column + 1)
            relevant = np.asarray(norms[(dataset, system)]["relevant"], dtype=np.float64)
            irrelevant = np.asarray(norms[(dataset, system)]["irrelevant"], dtype=np.float64)
            bins = np.linspace(min(relevant.min(), irrelevant.min()), max(relevant.max(), irrelevant.max()), 40)
            axes.hist(irrelevant, bins=bins, density=True, alpha=0.5, label="irrelevant")
            axes.hist(relevant, bins=bins, density=True, alpha=0.5, label="relevant")
            cell = model.cell(dataset, system)
            d = finite(cell.diagnostics.get("document_norm_cohens_d")) if cell else None
            axes.set_title(f"{dataset} / {system}" + (f"  d={d:+.2f}" if d is not None else ""), fontsize=8)
            axes.tick_params(labelsize=7)
    figure.axes[0].legend(fontsize=7)
    figure.supxlabel("raw document norm")
    return _save(figure, path)


def plot_recall(model: ReportModel, path: Path) -> Path | None:
    """recall@k against k per dataset: a cell's recall curve, else its recall@k metrics."""
    datasets = [dataset for dataset in model.datasets if any(
        cell.curve or any(_recall_k(k) for k in cell.means) for cell in model.cells_of(dataset))]
    if not datasets:
        return None
    figure = _figure(4.0 * len(datasets), 3.4)
    for index, dataset in enumerate(datasets):
        axes = figure.add_subplot(1, len(datasets), index + 1)
        largest = 1
        for cell in model.cells_of(dataset):
            if cell.curve:
                ks, values = list(range(1, len(cell.curve) + 1)), cell.curve
            else:
                points = sorted((_recall_k(k), v) for k, v in cell.means.items() if _recall_k(k))
                ks, values = [k for k, _ in points], [v for _, v in points]
            if ks:
                axes.plot(ks, values, marker="." if len(ks) > 5 else "o", label=cell.system)
                largest = max(largest, ks[-1])
        axes.set_xscale("log")
        ticks = [k for k in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000) if k <= largest]
        axes.set_xticks(ticks, [str(k) for k in ticks])
        axes.set_xlabel("k")
        axes.set_ylabel("recall@k")
        axes.set_title(dataset)
    figure.axes[-1].legend(fontsize=7)
    return _save(figure, path)


def _recall_k(metric: str) -> int | None:
    """k of ``recall@k`` (None for other metrics, and for ``recall@budget``: no fixed k)."""
    name, _, k = metric.partition("@")
    return int(k) if name == "recall" and k.isdigit() else None


def _figure(width: float, height: float):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=110)
    FigureCanvasAgg(figure)  # Agg without pyplot: no global backend state, safe in servers and threads
    return figure


def _save(figure, path: Path) -> Path:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    durable.write_bytes(path, buffer.getvalue())
    return path
