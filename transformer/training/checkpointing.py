"""orbax checkpoints of the train state, the data-iterator position and the resolved config.

Layout: DIR/checkpoints/<step>/{state,data,config}. Saves are asynchronous (training continues while
the arrays are written); only finalised steps are ever listed, so an unfinished save is invisible.
Restoring falls back to the previous step, with a warning, when the latest one cannot be read.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import grain
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


class Checkpointer:
    def __init__(self, directory: str, *, keep: int = 3, async_save: bool = True):
        self.directory = os.path.abspath(directory)
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, enable_async_checkpointing=async_save,
                                               create=True, cleanup_tmp_directories=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: Any, data_iterator: Any, config: dict, *, force: bool = False) -> bool:
        args = ocp.args.Composite(state=ocp.args.StandardSave(state),
                                  data=grain.checkpoint.CheckpointSave(data_iterator),
                                  config=ocp.args.JsonSave(config))
        return self.manager.save(step, args=args, force=force)

    def restore(self, abstract_state: Any, data_iterator: Any) -> tuple[int, Any] | None:
        """Restores the newest readable step into `abstract_state`'s shardings and `data_iterator`.

        Returns (step, state), or None when there is no checkpoint. A step that fails to read is
        skipped with a warning (never deleted); if every step fails, the error is raised rather than
        silently starting from scratch.
        """
        steps = self.steps()
        errors = []
        for step in reversed(steps):
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(abstract_state),
                    data=grain.checkpoint.CheckpointRestore(data_iterator)))
                if errors:
                    log.warning("restored step %d after skipping unreadable checkpoints: %s", step, errors)
                return step, restored["state"]
            except Exception as e:  # noqa: BLE001 - any read failure means this step is unusable
                msg = f"step {step}: {type(e).__name__}: {str(e)[:300]}"
                log.warning("checkpoint %s is unreadable, trying the previous one (%s)", step, msg)
                print(f"warning: checkpoint {step} in {self.directory} is unreadable; trying the previous one "
                      f"({msg})", flush=True)
                errors.append(msg)
        if errors:
            raise RuntimeError(f"no readable checkpoint in {self.directory}: " + "; ".join(errors))
        return None

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
