"""Bench results and their reports: Markdown, JSON, CSV, a PNG chart and the recommended .env."""

from __future__ import annotations

import csv
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trainer.bench.catalogue import UNSET
from trainer.bench.runner import OK, StepCallback

CSV_COLUMNS = (
    "name", "group", "status", "on_top_of", "tokens_per_s", "samples_per_s", "mfu", "peak_mem_bytes",
    "step_time_s", "generation_s", "speed_rel", "mem_rel", "measured_steps", "wall_s", "changes", "reason", "note",
)


@dataclass
class RowResult:
    name: str
    group: str
    description: str
    status: str
    env: dict[str, str] = field(default_factory=dict)
    changes: dict[str, str] = field(default_factory=dict)
    on_top_of: str | None = None
    reason: str = ""
    note: str = ""
    same_training: bool = True
    tokens_per_s: float | None = None
    samples_per_s: float | None = None
    step_time_s: float | None = None
    mfu: float | None = None
    peak_mem_bytes: int | None = None
    measured_steps: int = 0
    generation_s: float | None = None  # online RL: of step_time_s, producing the completions
    loss: float | None = None  # the mean training loss of the measured steps
    wall_s: float = 0.0
    speed_rel: float | None = None
    mem_rel: float | None = None

    @property
    def ok(self) -> bool:
        return self.status == OK


@dataclass
class BenchResult:
    meta: dict
    baseline: str
    rows: list[RowResult]
    recommended: str | None = None
    recommended_env: dict[str, str] = field(default_factory=dict)

    def row(self, name: str) -> RowResult | None:
        return next((r for r in self.rows if r.name == name), None)

    def to_json(self) -> dict:
        return {
            "meta": self.meta,
            "baseline": self.baseline,
            "recommended": {"row": self.recommended, "env": self.recommended_env} if self.recommended else None,
            "rows": [asdict(r) for r in self.rows],
        }


def fill_relative(result: BenchResult) -> None:
    """speed_rel and mem_rel of every measured row, against the baseline row (which gets 1.0)."""
    base = result.row(result.baseline)
    for row in result.rows:
        if base is None or not base.ok or not row.ok:
            continue
        if base.tokens_per_s and row.tokens_per_s is not None:
            row.speed_rel = row.tokens_per_s / base.tokens_per_s
        if base.peak_mem_bytes and row.peak_mem_bytes is not None:
            row.mem_rel = row.peak_mem_bytes / base.peak_mem_bytes


def fastest_row(rows: list[RowResult]) -> RowResult | None:
    """The fastest row that ran (so it fits in memory) and trains the same thing as the baseline."""
    candidates = [r for r in rows if r.ok and r.same_training and r.tokens_per_s is not None]
    return max(candidates, key=lambda r: r.tokens_per_s or 0.0, default=None)


# ---- formatting -------------------------------------------------------------------------------

def human_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1024
    return f"{size:.2f} GiB"


def fmt_number(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def fmt_ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def fmt_percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def row_outcome_text(row: RowResult) -> str:
    if row.ok:
        return row.note
    return f"{row.status}: {row.reason}" if row.reason else row.status


def table_cells(row: RowResult) -> list[str]:
    """One row of the results table, as text (shared by Markdown and the terminal table)."""
    return [
        row.name, row.on_top_of or "-", row.status, fmt_number(row.tokens_per_s), fmt_number(row.samples_per_s, 2),
        fmt_percent(row.mfu), human_bytes(row.peak_mem_bytes), fmt_ratio(row.speed_rel), fmt_ratio(row.mem_rel),
        row_outcome_text(row),
    ]


TABLE_HEADERS = ["row", "on top of", "status", "tokens/s", "samples/s", "MFU", "peak memory",
                 "speed vs baseline", "memory vs baseline", "note / reason"]


# ---- .env ---------------------------------------------------------------------------------------

def env_lines(result: BenchResult) -> list[str]:
    """The recommended configuration as `.env` lines, with a comment saying what it was measured on."""
    if not result.recommended:
        return ["# no bench row ran successfully: nothing to recommend"]
    meta = result.meta
    row = result.row(result.recommended)
    speed = f", {fmt_ratio(row.speed_rel)} the baseline's tokens/s" if row and row.speed_rel else ""
    lines = [
        f"# trainkit bench {meta.get('date', '')}: fastest configuration that fit: row `{result.recommended}`{speed}",
        f"# measured on {meta.get('device', '?')} for TRAIN_MODEL={meta.get('model')} "
        f"TRAIN_SEQ_LEN={meta.get('seq_len')}",
    ]
    for key, value in result.recommended_env.items():
        lines.append(f"# {key}: leave it unset (the trainer chooses)" if value == UNSET else f"{key}={value}")
    return lines


# ---- files ---------------------------------------------------------------------------------------

def write_reports(result: BenchResult, out_dir: Path) -> dict[str, Path]:
    """Write results.{json,csv,md}, chart.png and recommended.env into out_dir; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {
        "json": out_dir / "results.json",
        "csv": out_dir / "results.csv",
        "md": out_dir / "results.md",
        "png": out_dir / "chart.png",
        "env": out_dir / "recommended.env",
    }
    paths["json"].write_text(json.dumps(result.to_json(), indent=2) + "\n")
    write_csv(result, paths["csv"])
    paths["md"].write_text(markdown(result))
    write_chart(result, paths["png"])
    paths["env"].write_text("\n".join(env_lines(result)) + "\n")
    return paths


def write_csv(result: BenchResult, path: Path) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in result.rows:
            record = asdict(row)
            record["changes"] = " ".join(f"{k}={v}" for k, v in row.changes.items())
            writer.writerow({key: "" if record.get(key) is None else record[key] for key in CSV_COLUMNS})


def markdown(result: BenchResult) -> str:
    meta = result.meta
    lines = [
        "# trainkit bench results",
        "",
        f"- date: {meta.get('date')}",
        f"- device: {meta.get('device')}",
        f"- versions: {meta.get('versions')}",
        f"- model `{meta.get('model')}`, seq_len {meta.get('seq_len')}, micro-batch {meta.get('batch_size')}; "
        f"{meta.get('warmup')} warm-up + {meta.get('steps')} measured steps per row (medians)",
        f"- baseline: `{result.baseline}`; speed and memory columns are relative to it",
        "- tokens/s and MFU: the measured steps only, checkpoint time left out (no checkpoint is written while a row "
        "is measured), padding not counted as tokens; the `auto` row on a GPU lets the batch search choose the batch",
        f"- peak memory: {meta.get('memory', 'peak memory')}",
        f"- load average before the bench: {meta.get('load_before', 'unknown')}",
        *([f"- **interrupted**: {meta['interrupted']}"] if meta.get("interrupted") else []),
        *([f"- **incomplete**: {meta['left']}; the same command again measures them"] if meta.get("left") else []),
        *baseline_warning(result),
        "",
        "| " + " | ".join(TABLE_HEADERS) + " |",
        "| " + " | ".join("---" for _ in TABLE_HEADERS) + " |",
    ]
    lines += ["| " + " | ".join(_md_escape(c) for c in table_cells(row)) + " |" for row in result.rows]
    lines += ["", "## Recommended configuration", "", "```sh", *env_lines(result), "```", ""]
    return "\n".join(lines)


def baseline_warning(result: BenchResult) -> list[str]:
    base = result.row(result.baseline)
    if base is None or base.ok:
        return []
    return [f"- **the baseline did not run** ({row_outcome_text(base)}), so the relative columns are empty; "
            "lower TRAIN_BATCH_SIZE (or raise --row-timeout) to measure it"]


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def write_chart(result: BenchResult, path: Path) -> None:
    """Two horizontal bar charts, tokens/s and peak memory per row; rows that did not run are labelled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [row.name for row in result.rows]
    speeds = [row.tokens_per_s or 0.0 for row in result.rows]
    mems = [(row.peak_mem_bytes or 0) / 2**30 for row in result.rows]
    fig, (ax_speed, ax_mem) = plt.subplots(1, 2, figsize=(12, max(3.0, 0.35 * len(names) + 1.5)), sharey=True)
    colors = ["tab:green" if row.name == result.recommended else "tab:blue" for row in result.rows]
    ax_speed.barh(names, speeds, color=colors)
    ax_speed.set_xlabel("tokens/s (median)")
    ax_mem.barh(names, mems, color="tab:orange")
    ax_mem.set_xlabel(f"{result.meta.get('memory', 'peak memory')} (GiB)")
    for index, row in enumerate(result.rows):
        if not row.ok:
            ax_speed.text(0, index, f" {row.status}", va="center", fontsize=8, color="tab:red")
    ax_speed.invert_yaxis()
    fig.suptitle(f"trainkit bench: {result.meta.get('model')} on {result.meta.get('device')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---- terminal -------------------------------------------------------------------------

class BenchProgress:
    """A rich progress bar on stderr: one tick per row, the current row's step count, a line per finished row."""

    def __init__(self, total_rows: int) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = Console(stderr=True)
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=self.console)
        self.task = self.bar.add_task("bench", total=total_rows)

    def __enter__(self) -> BenchProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.update(self.task, description="bench")
        self.bar.stop()

    def start_row(self, label: str, max_steps: int) -> StepCallback:
        def on_step(done: int) -> None:
            self.bar.update(self.task, description=f"{label}: step {min(done, max_steps)}/{max_steps}")

        on_step(0)
        return on_step

    def row_done(self, row: RowResult) -> None:
        from rich.markup import escape

        self.bar.advance(self.task)
        if row.ok:
            self.bar.console.print(f"[green]{row.name}[/]: {fmt_number(row.tokens_per_s)} tokens/s")
        else:
            self.bar.console.print(f"[yellow]{row.name}[/]: {row.status}: {escape(row.reason)}")


def print_summary(result: BenchResult, paths: dict[str, Path]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title=f"trainkit bench: {result.meta['model']} on {result.meta['device']}")
    for header in TABLE_HEADERS:
        table.add_column(header, overflow="fold")
    for row in result.rows:
        cells = [Text(cell) for cell in table_cells(row)]  # reasons may hold [brackets], never markup
        table.add_row(*cells, style="bold green" if row.name == result.recommended else None)
    console = Console()
    if not console.is_terminal:
        # Logs (docker logs, CI) have no width; rich's 80 columns would fold every cell.
        console.width = 200
    console.print(table)
    for warning in baseline_warning(result):
        console.print(Text(warning.removeprefix("- ").replace("**", "")), style="yellow")
    console.print(f"Results: {paths['md']}, {paths['json']}, {paths['csv']}, {paths['png']}")
    console.print(f"Recommended configuration ({paths['env']}):", highlight=False)
    for line in env_lines(result):
        print(line)
