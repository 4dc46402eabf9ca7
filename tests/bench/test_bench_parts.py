"""The bench's pieces on real inputs: row selection, failure reasons, metric medians, relative columns."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from trainer.bench.catalogue import (
    AUTO_ENV,
    BASELINE,
    BASELINE_ENV,
    DEFAULTS,
    PRECOMPUTED_REFERENCE,
    UnknownRowError,
    catalogue,
    row_names,
    select_rows,
)
from trainer.bench.report import BenchResult, RowResult, env_lines, fastest_row, fill_relative
from trainer.bench.runner import (
    ERROR,
    OOM,
    SKIPPED,
    RunPlan,
    config_error_message,
    failure_reason,
    summarize_metrics,
)
from trainer.bench.session import Bench, Context, changes, grad_accum_env, recommendable
from trainer.config.schema import field_names


def test_every_row_sets_only_schema_variables() -> None:
    known = {f"TRAIN_{name.upper()}" for name in field_names()}
    for row in catalogue():
        assert set(row.env) <= known, row.name
    assert set(BASELINE_ENV) <= known


def test_row_names_are_unique_and_cover_the_issue() -> None:
    names = row_names()
    assert len(names) == len(set(names))
    for wanted in ("fp32", "tf32", "fp16", "bf16", "adamw_torch", "adamw_torch_fused", "adamw_apex_fused",
                   "adamw_bnb_8bit", "adafactor", "grad_ckpt", "grad_accum", "max_batch", "compile", "eager",
                   "sdpa", "flash_attention_2", "zero1", "zero2", "zero3", "zero1_offload", "zero2_offload",
                   "zero3_offload", "lora", "qlora", "combined", "auto", "flash_attention_4", "liger"):
        assert wanted in names


def test_selection_keeps_catalogue_order_and_always_adds_the_baseline_and_the_defaults() -> None:
    rows = select_rows("grad_ckpt, bf16")
    assert [r.name for r in rows] == [BASELINE, "bf16", DEFAULTS, "grad_ckpt"]


def test_selection_by_group() -> None:
    assert [r.name for r in select_rows("zero")] == [BASELINE, DEFAULTS, "zero1", "zero1_offload", "zero2",
                                                       "zero2_offload", "zero3", "zero3_offload"]


def test_unknown_row_names_the_culprit_and_the_valid_names() -> None:
    with pytest.raises(UnknownRowError, match=r"unknown bench row\(s\): bf17.*Valid rows: fp32"):
        select_rows("bf16,bf17")


def test_config_error_becomes_a_skip_with_the_trainers_message() -> None:
    stderr = "some log line\nerror: TRAIN_PRECISION=fp16 needs a CUDA GPU; use fp32 or bf16 on CPU\n"
    assert failure_reason(2, stderr) == (SKIPPED, "TRAIN_PRECISION=fp16 needs a CUDA GPU; use fp32 or bf16 on CPU")


def test_multi_problem_config_error_is_joined_on_one_line() -> None:
    lines = ["error: 2 problems with the configuration:", "  - flash-attn is not installed", "  - needs a GPU"]
    assert config_error_message(lines) == "2 problems with the configuration: flash-attn is not installed; needs a GPU"


def test_cuda_oom_is_reported_as_out_of_memory() -> None:
    stderr = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
              "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    status, reason = failure_reason(1, stderr)
    assert status == OOM
    assert reason.startswith("torch.OutOfMemoryError: CUDA out of memory.")


def test_crash_reason_is_the_exceptions_first_line() -> None:
    stderr = ("Traceback (most recent call last):\n  File \"x.py\", line 3, in f\n    raise RuntimeError('boom')\n"
              "RuntimeError: boom\nsecond line of the message\n")
    assert failure_reason(1, stderr) == (ERROR, "exit 1: RuntimeError: boom")


def test_sigkill_suggests_host_memory() -> None:
    status, reason = failure_reason(-9, "")
    assert status == ERROR
    assert "SIGKILL" in reason and "host memory" in reason


def _write_metrics(path: Path, tokens: list[float], peaks: list[int]) -> None:
    lines = []
    for step, (tok, peak) in enumerate(zip(tokens, peaks, strict=True), start=1):
        lines.append(json.dumps({"step": step, "epoch": 0.1, "loss": 5.0, "lr": 1e-4, "grad_norm": 1.0,
                                 "tokens_per_s": tok, "samples_per_s": tok / 64, "step_time_s": 64 / tok,
                                 "peak_mem_bytes": peak, "mfu": None, "time": 0.0}))
    path.write_text("\n".join(lines) + "\n{\"step\": 9, \"tok")  # a torn last line, as from a killed writer


def test_medians_exclude_warmup_and_peak_is_the_maximum(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics, [10.0, 500.0, 100.0, 300.0, 200.0], [5, 1, 2, 4, 3])
    measured = summarize_metrics(metrics, warmup=2)
    assert measured.measured_steps == 3
    assert measured.tokens_per_s == 200.0
    assert measured.samples_per_s == pytest.approx(200.0 / 64)
    assert measured.peak_mem_bytes == 4
    assert measured.mfu is None


def test_no_measured_step_is_an_error(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    _write_metrics(metrics, [10.0], [1])
    with pytest.raises(ValueError, match="no logged step after the 3 warm-up steps"):
        summarize_metrics(metrics, warmup=3)


def test_grad_accum_keeps_the_effective_batch() -> None:
    assert grad_accum_env(8) == {"TRAIN_BATCH_SIZE": "4", "TRAIN_GRAD_ACCUM": "2"}
    assert grad_accum_env(9) == {"TRAIN_BATCH_SIZE": "3", "TRAIN_GRAD_ACCUM": "3"}


def test_changes_list_what_differs_from_the_baseline() -> None:
    env = {**BASELINE_ENV, "TRAIN_BATCH_SIZE": "8", "TRAIN_PRECISION": "bf16"}
    assert changes(env) == {"TRAIN_BATCH_SIZE": "8", "TRAIN_PRECISION": "bf16"}


def _row(name: str, status: str, tokens: float | None, peak: int | None, same_training: bool = True) -> RowResult:
    return RowResult(name, "g", "d", status, env={"TRAIN_PRECISION": "fp32"}, tokens_per_s=tokens,
                     peak_mem_bytes=peak, same_training=same_training)


def test_relative_columns_and_recommendation() -> None:
    rows = [_row("fp32", "ok", 100.0, 1000), _row("bf16", "ok", 250.0, 600), _row("fp16", SKIPPED, None, None),
            _row("lora", "ok", 900.0, 100, same_training=False)]
    result = BenchResult({"model": "tiny", "seq_len": 64}, BASELINE, rows)
    fill_relative(result)
    assert rows[0].speed_rel == 1.0 and rows[0].mem_rel == 1.0
    assert rows[1].speed_rel == 2.5 and rows[1].mem_rel == 0.6
    assert rows[2].speed_rel is None
    # LoRA trains something else: measured, never recommended.
    assert fastest_row(rows) is rows[1]


def test_env_lines_without_a_recommendation_say_so() -> None:
    result = BenchResult({}, BASELINE, [_row("fp32", ERROR, None, None)])
    assert env_lines(result) == ["# no bench row ran successfully: nothing to recommend"]


def _measured(name: str, group: str, env: dict[str, str], tokens: float, on_top_of: str | None) -> RowResult:
    return RowResult(name, group, "d", "ok", env=env, tokens_per_s=tokens, on_top_of=on_top_of)


def _bench_with(rows: list[RowResult]) -> Bench:
    ctx = Context("tiny", False, 64, batch_size=8, on_gpu=True, max_batch=64)
    bench = Bench([], ctx, RunPlan(1, 1, 60, Path("/nonexistent")), ui=None)
    bench.results = {row.name: row for row in rows}
    return bench


def _auto_based_rows() -> tuple[list[RowResult], dict[str, str]]:
    """A GPU table: the baseline, bf16 on it (fast, but with the baseline's TF32=0 and adamw_torch), the defaults,
    and technique rows on top of the defaults."""
    base = {**BASELINE_ENV, "TRAIN_BATCH_SIZE": "8"}
    auto = {**base, **AUTO_ENV}
    rows = [
        _measured("fp32", "precision", base, 100.0, None),
        _measured("bf16", "precision", {**base, "TRAIN_PRECISION": "bf16"}, 300.0, "fp32"),
        _measured(DEFAULTS, "defaults", auto, 290.0, "fp32"),
        _measured("adamw_torch", "optim", {**auto, "TRAIN_OPTIM": "adamw_torch"}, 280.0, DEFAULTS),
        _measured("adafactor", "optim", {**auto, "TRAIN_OPTIM": "adafactor"}, 295.0, DEFAULTS),
        _measured("eager", "attn", {**auto, "TRAIN_ATTN": "eager"}, 200.0, DEFAULTS),
        _measured("compile", "compile", {**auto, "TRAIN_COMPILE": "1"}, 420.0, DEFAULTS),
        _measured("grad_ckpt", "memory", {**auto, "TRAIN_GRAD_CKPT": "1"}, 999.0, DEFAULTS),
        _measured("max_batch", "batch", {**auto, "TRAIN_BATCH_SIZE": "32"}, 400.0, DEFAULTS),
    ]
    return rows, auto


def test_technique_rows_build_on_the_defaults() -> None:
    rows, auto = _auto_based_rows()
    bench = _bench_with(rows)
    assert bench.reference() is rows[2]
    assert bench.reference_env() == auto


def test_the_recommendation_is_auto_plus_what_measured_faster() -> None:
    """bf16 on the baseline beat the defaults here, but recommending it would turn TF32 off and choose adamw_torch,
    undoing auto's choices (the 125m H100 table of issue 27): only the defaults and the rows on them compete."""
    rows, auto = _auto_based_rows()
    rows = [r for r in rows if r.name != "grad_ckpt"]  # a memory row: the fastest here only to test the pool
    best = fastest_row(recommendable(rows))
    assert best is not None and best.name == "compile"
    assert best.env == {**auto, "TRAIN_COMPILE": "1"}
    assert {best.env[k] for k in ("TRAIN_PRECISION", "TRAIN_TF32", "TRAIN_OPTIM", "TRAIN_ATTN")} == {"auto"}
    assert fastest_row(recommendable(rows[:2])).name == "bf16"  # no defaults row: every row competes


def test_combined_stacks_the_winners_over_the_defaults() -> None:
    rows, auto = _auto_based_rows()
    env, names = _bench_with(rows).combined_plan()
    assert names == [DEFAULTS, "adafactor", "compile", "max_batch"]
    # grad_ckpt is never stacked, eager and adamw_torch were slower than the defaults
    assert env == {**auto, "TRAIN_OPTIM": "adafactor", "TRAIN_COMPILE": "1", "TRAIN_BATCH_SIZE": "32"}


def test_combined_needs_two_winners() -> None:
    base = {**BASELINE_ENV, "TRAIN_BATCH_SIZE": "8"}
    auto = {**base, **AUTO_ENV}
    bench = _bench_with([
        _measured("fp32", "precision", base, 100.0, None),
        _measured(DEFAULTS, "defaults", auto, 110.0, "fp32"),
        _measured("adamw_torch_fused", "optim", {**auto, "TRAIN_OPTIM": "adamw_torch_fused"}, 120.0, DEFAULTS),
    ])
    assert bench.combined_plan() == "only `adamw_torch_fused` beat `auto`: nothing to combine"


def test_a_torchrun_workers_config_error_is_a_skip_too() -> None:
    stderr = ("[rank0]:error: TRAIN_OPTIM=adamw_bnb_8bit needs bitsandbytes\n"
              "[rank1]:error: TRAIN_OPTIM=adamw_bnb_8bit needs bitsandbytes\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: trainer FAILED\n")
    assert failure_reason(1, stderr) == (SKIPPED, "TRAIN_OPTIM=adamw_bnb_8bit needs bitsandbytes")


def test_a_torchrun_workers_oom_is_out_of_memory() -> None:
    stderr = "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB\n"
    assert failure_reason(1, stderr)[0] == OOM


def test_a_kept_combined_row_is_measured_again_when_its_winners_changed() -> None:
    rows, auto = _auto_based_rows()
    stale = _measured("combined", "combined", {**auto, "TRAIN_COMPILE": "1", "TRAIN_BATCH_SIZE": "32"}, 500.0, DEFAULTS)
    bench = _bench_with(rows)
    assert not bench.still_valid(stale)  # adafactor beat the defaults since: the stack differs
    current = _measured("combined", "combined", bench.combined_plan()[0], 510.0, DEFAULTS)
    assert bench.still_valid(current) and bench.still_valid(rows[3])


def test_on_a_gpu_the_defaults_row_leaves_the_batch_to_the_search(tmp_path: Path) -> None:
    """Issue 34 item 5: TRAIN_BATCH_SIZE (and TRAIN_GRAD_ACCUM, whose product the search would keep) are removed
    from the `auto` row's environment, the user's own included; a CPU, with no search, keeps TRAIN_BATCH_SIZE."""
    from trainer.bench.catalogue import UNSET
    from trainer.bench.runner import child_environment

    gpu = _bench_with([]).defaults_env()
    assert gpu["TRAIN_BATCH_SIZE"] == gpu["TRAIN_GRAD_ACCUM"] == UNSET
    cpu = Bench([], Context("tiny", False, 64, batch_size=8, on_gpu=False, max_batch=64),
                RunPlan(1, 1, 60, tmp_path), ui=None).defaults_env()  # fmt: skip
    assert cpu["TRAIN_BATCH_SIZE"] == "8"
    os.environ["TRAIN_BATCH_SIZE"] = "16"  # the user's setting, inherited by every row unless a row says otherwise
    try:
        child = child_environment(gpu, RunPlan(1, 1, 60, tmp_path), tmp_path / "out")
    finally:
        del os.environ["TRAIN_BATCH_SIZE"]
    assert "TRAIN_BATCH_SIZE" not in child and "TRAIN_GRAD_ACCUM" not in child and child["TRAIN_PRECISION"] == "auto"
    row = _measured(DEFAULTS, "defaults", gpu, 100.0, "fp32")
    result = BenchResult(meta={}, baseline="fp32", rows=[row], recommended=DEFAULTS, recommended_env=gpu)
    assert "# TRAIN_BATCH_SIZE: leave it unset (the trainer chooses)" in env_lines(result)


def test_a_row_logs_once_per_window_not_per_step(tmp_path: Path) -> None:
    """Issue 34 item 6: each metrics line costs the trainer a host-device sync (its read of the loss); the bench
    asks for a line per window of steps, the warm-up and the measured steps each whole windows."""
    from trainer.bench.runner import run_controls

    plan = RunPlan(warmup=4, steps=12, timeout_s=60, work_dir=tmp_path)
    assert plan.log_steps == 4 and run_controls(plan, tmp_path)["TRAIN_LOG_STEPS"] == "4"
    assert RunPlan(1, 2, 60, tmp_path).log_steps == 1 and RunPlan(0, 6, 60, tmp_path).log_steps == 6
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps({"step": s, "tokens_per_s": float(s), "peak_mem_bytes": 1}) + "\n"
                               for s in (4, 8, 12, 16)))  # fmt: skip
    measured = summarize_metrics(metrics, plan.warmup, plan.log_steps)
    assert measured.measured_steps == 12 and measured.tokens_per_s == 12.0


def test_the_precomputed_reference_row_applies_to_methods_with_a_reference() -> None:
    """pref_precompute measures TRAIN_PREF_REFERENCE=precompute against the frozen copy the rows before it hold;
    for SFT (or a method without a reference) it is skipped, saying which methods it needs."""
    spec = next(row for row in catalogue() if row.name == PRECOMPUTED_REFERENCE)
    assert spec.env == {"TRAIN_PREF_REFERENCE": "precompute"} and not spec.same_training  # never recommended
    plan = RunPlan(1, 1, 60, Path("/nonexistent"))
    reasons = {method: Bench([], Context("tiny", False, 64, 8, False, 64, method=method), plan, ui=None)
               .skip_reason(spec) for method in ("sft", "orpo", "dpo", "kto")}  # fmt: skip
    assert "not TRAIN_METHOD=sft; set TRAIN_METHOD=dpo or kto" in reasons["sft"] and reasons["orpo"]
    assert reasons["dpo"] == reasons["kto"] == ""


def test_the_moe_rows_run_for_a_mixture_of_experts_where_the_device_has_the_kernel() -> None:
    """Each TRAIN_MOE_IMPL on the reference; not measured (saying why) for a dense model, and grouped_mm not where
    torch's grouped GEMM cannot run; each measured row's loss against the first moe row's."""
    from trainer.bench.catalogue import MOE_ROWS
    from trainer.bench.command import moe_problem
    from trainer.bench.session import with_loss_note

    specs = {row.name: row for row in catalogue() if row.group == "moe"}
    assert tuple(specs) == MOE_ROWS and specs["moe_eager"].env == {"TRAIN_MOE_IMPL": "eager"}
    plan = RunPlan(1, 1, 60, Path("/nonexistent"))
    dense = Bench([], Context("tiny", False, 64, 8, False, 64, moe=moe_problem("tiny")), plan, ui=None)
    assert dense.skip_reason(specs["moe_eager"]).startswith("not measured here: TRAIN_MODEL=tiny is no mixture")
    assert moe_problem("tiny-moe") == ""
    turing = Bench([], Context("tiny-moe", False, 64, 8, True, 64, grouped_mm="needs 8.0"), plan, ui=None)
    assert turing.skip_reason(specs["moe_grouped_mm"]) == "not measured here: needs 8.0"
    assert turing.skip_reason(specs["moe_eager"]) == ""
    first = _measured("moe_eager", "moe", {}, 100.0, DEFAULTS)
    first.loss = 5.5
    second = _measured("moe_grouped_mm", "moe", {}, 120.0, DEFAULTS)
    second.loss = 5.5000004
    assert "moe_eager's 5.5, |difference| 4e-07" in with_loss_note(second, [first]).note
