"""experiments.sample on an encoder–decoder run: <X> in the prompt becomes a sentinel to fill in."""
import os
import subprocess
import sys

import pytest

from configs import seq2seq
from cli_modules import cli_module

_with_sentinels = cli_module("sample")._with_sentinels
from transformer.data import get_tokenizer
from transformer.training.loop import train
from xla_env import xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_sentinels_are_shown_by_index():
    tok = get_tokenizer(seq2seq.get_config("t5_tiny").data)
    ids = [tok.vocab_size] + tok.encode("ab").tolist() + [tok.vocab_size + 1] + tok.encode("c").tolist()
    assert _with_sentinels(tok, ids) == "<X0>ab<X1>c"


@pytest.mark.slow
def test_sample_cli_fills_spans_with_a_seq2seq_run(tmp_path, corpus_dir):
    c = seq2seq.get_config("t5_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 64
    c.train.update(dict(steps=2, batch_size=8, warmup_steps=1, log_every=2, eval_every=2, eval_steps=1,
                        checkpoint_every=2))
    assert train(c, str(tmp_path / "t5"), verbose=False)["status"] == "ok"
    env = dict(os.environ, XLA_FLAGS=xla_flags(1), TFDS_DATA_DIR=corpus_dir)
    out = subprocess.run([sys.executable, "-m", "experiments.sample", f"--workdir={tmp_path / 't5'}",
                          "--prompt=def f(x):\n    return <X>\n", "--max_new_tokens=8", "--temperature=0"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "--- sample 1/1 (step 2," in out.stdout and "tokens in" in out.stdout
