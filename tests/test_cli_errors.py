"""experiments.cli.run: the project's input errors (ConfigError) are one `error:` line and exit 2; anything
else — a ValueError from a bug in a layer, a TypeError in a config file — keeps its traceback and exits 1."""
from __future__ import annotations

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A new activation whose code has a bug: a ValueError raised while the model is traced.
BUGGY_LAYER = """
import sys
from absl import flags
from transformer.layers import feedforward

def buggy(x):
    raise ValueError("operands could not be broadcast together (a bug in a new layer)")

feedforward.ACTIVATIONS["buggy"] = buggy
from experiments import cli, train
flags.mark_flags_as_required(["config", "workdir"])
sys.argv = ["experiments.train", *sys.argv[1:]]
cli.run(train.main)
"""


def _python(args: list[str], cwd: str = REPO) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "TRANSFORMER_HUGE_PAGES": "0", "JAX_PLATFORMS": "cpu"}
    env.pop("TRANSFORMER_TRACEBACK", None)
    env.pop("XLA_FLAGS", None)  # one device: nothing here needs a mesh
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def _error_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def test_a_value_error_from_a_bug_in_a_layer_keeps_its_traceback(tmp_path, corpus_dir):
    r = _python(["-c", BUGGY_LAYER, "--config=configs/lm.py:gpt2_tiny", f"--workdir={tmp_path}/run",
                 f"--config.data.data_dir={corpus_dir}", "--config.model.activation=buggy",
                 "--config.train.warmup_steps=1", "--config.train.steps=2"])
    text = r.stdout + r.stderr
    assert r.returncode == 1, text
    assert "Traceback (most recent call last)" in r.stderr, text
    assert "ValueError: operands could not be broadcast together (a bug in a new layer)" in r.stderr, text
    assert "in buggy" in r.stderr  # the frame of the bug is shown
    assert not _error_lines(text), text


def test_config_files_raising_a_config_error_or_a_bug(tmp_path):
    """A config file's ConfigError (bad preset) is input; its TypeError is a bug in the file."""
    (tmp_path / "user_error.py").write_text(
        "from transformer.spec import ConfigError\n"
        "def get_config(arg=None):\n    raise ConfigError(f'unknown preset {arg!r}; valid presets: a, b')\n")
    (tmp_path / "bug.py").write_text("def get_config(arg=None):\n    return 1 + 'x'\n")
    r = _python(["-m", "experiments.train", f"--config={tmp_path}/user_error.py:zz", f"--workdir={tmp_path}/w"])
    assert r.returncode == 2, r.stderr
    assert _error_lines(r.stderr) == ["error: --config: unknown preset 'zz'; valid presets: a, b"], r.stderr
    assert "Traceback" not in r.stderr
    r = _python(["-m", "experiments.train", f"--config={tmp_path}/bug.py", f"--workdir={tmp_path}/w"])
    assert r.returncode == 1, r.stderr
    assert "Traceback" in r.stderr and "TypeError: unsupported operand type(s) for +: 'int' and 'str'" in r.stderr
    assert not _error_lines(r.stderr), r.stderr
    assert not os.path.exists(tmp_path / "w")
