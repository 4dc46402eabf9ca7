"""TRAIN_PUSH_TO_HUB at the end of a successful run: export final/ (verified, with its model card), then upload it.

Lives with export, a floor below the run: trainer/run/train.py calls it; the upload itself is trainer.hub.push's.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainer.errors import EXIT_OK, EXIT_PUSH_FAILED, ConfigError
from trainer.hub.push import PUSH_FAILED_MARKER, push_folder

log = logging.getLogger("trainer")


def push_after_run(cfg: Any, output_dir: Path, world_size: int = 1) -> int:
    """TRAIN_PUSH_TO_HUB: export final/ to OUTPUT_DIR/export (merged, verified, model card), then upload it.
    A failure keeps final/ (and the export) and exits EXIT_PUSH_FAILED. Under torchrun a failed worker would make it
    restart the whole group (and train again): rank 0 leaves PUSH_FAILED_MARKER and exits 0 instead, and the
    launcher, once every worker is done, exits EXIT_PUSH_FAILED for it (trainer/launch/cli.py)."""
    from trainer.export.command import export
    from trainer.export.verify import ExportMismatch

    spec = cfg.settings.push_to_hub
    marker = output_dir / PUSH_FAILED_MARKER
    marker.unlink(missing_ok=True)
    try:
        folder = export(output_dir / "final", output_dir / "export")
        push_folder(folder, spec, check_offline=False)
    except (ConfigError, ExportMismatch) as exc:
        log.error("push failed: %s; final/ is kept in %s; push it later with `python -m trainer push %s %s`; exit %d",
                  getattr(exc, "message", exc), output_dir, output_dir, spec, EXIT_PUSH_FAILED)  # fmt: skip
        if world_size > 1:
            marker.write_text(f"{getattr(exc, 'message', exc)}\n")
            return EXIT_OK
        return EXIT_PUSH_FAILED
    return EXIT_OK
