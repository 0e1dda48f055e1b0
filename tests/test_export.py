"""experiments.export: a run's checkpoint and tokenizer as a Hugging Face directory that AutoTokenizer +
AutoModelForCausalLM load and that reproduces the run's logits; the tokenizer conversions (bytes,
SentencePiece, tokenizer.json) against the run's tokenizers; bad input."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from transformer.spec import ConfigError, MissingInputError  # noqa: E402
from transformer.data.tokenizers import (ByteTokenizer, HFTokenizer, SentencePieceTokenizer,  # noqa: E402
                                         train_sentencepiece)
from transformer.interop.export import export_run  # noqa: E402
from transformer.interop.hf_tokenizer import save_tokenizer  # noqa: E402
from transformer.training.restore import load_run  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPT = "def f(x):\n    return x + 1  # naïve ∑\n"
TEXTS = [open(os.path.join(os.path.dirname(json.__file__), name)).read()
         for name in ("decoder.py", "encoder.py", "scanner.py")]


def _ours(workdir: str, step: int | None = None) -> tuple[list[int], np.ndarray]:
    run = load_run(workdir, step=step)
    ids = [run.tokenizer.bos_id] + run.tokenizer.encode(PROMPT).tolist()
    return ids, np.asarray(run.model.apply({"params": run.params}, jnp.asarray([ids])))[0]


@pytest.mark.slow  # CI's 15 minutes: 17 s of the default run on 2 loaded cores (2026-11-27)
def test_exported_byte_run_reproduces_our_logits_in_transformers(tiny_lm_run, tmp_path):
    """The tokenizer encodes the prompt to bos + bytes + 3 (the byte offset is in the file, not in a script),
    and AutoModelForCausalLM's logits on those ids equal the run's to 1e-4; --step picks the checkpoint."""
    out = str(tmp_path / "hf")
    summary = export_run(tiny_lm_run, out)
    assert summary["step"] == 4 and summary["model_type"] == "gpt2"
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
    tok = transformers.AutoTokenizer.from_pretrained(out)
    model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    ids, ours = _ours(tiny_lm_run)
    encoded = tok(PROMPT, return_tensors="pt")
    assert encoded["input_ids"][0].tolist() == ids == [1] + [b + 3 for b in PROMPT.encode("utf-8")]
    assert tok.decode(encoded["input_ids"][0], skip_special_tokens=True) == PROMPT
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)
    assert (model.config.bos_token_id, model.config.eos_token_id, model.config.pad_token_id) == (1, 2, 0)
    with torch.no_grad():
        theirs = model(**encoded).logits[0].numpy()
    assert theirs.shape == ours.shape == (len(ids), 384)   # 259 byte ids padded to 384
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)
    # an earlier checkpoint: other weights, and the export follows them
    summary2 = export_run(tiny_lm_run, str(tmp_path / "hf2"), step=2)
    _, ours2 = _ours(tiny_lm_run, step=2)
    model2 = transformers.AutoModelForCausalLM.from_pretrained(summary2["out"]).eval()
    with torch.no_grad():
        theirs2 = model2(**encoded).logits[0].numpy()
    np.testing.assert_allclose(theirs2, ours2, atol=1e-4, rtol=0)
    assert np.abs(ours2 - ours).max() > 1e-3


def _check_tokenizer(tok, path: str, extra: list[str]) -> None:
    save_tokenizer(tok, path, extra)
    hf = transformers.AutoTokenizer.from_pretrained(path)
    for text in TEXTS + [PROMPT, "  \t\n\n  x  ", "é世🙂 ﬁ ① ＡＢ"]:
        assert hf(text, add_special_tokens=False)["input_ids"] == tok.encode(text).tolist()
        assert hf(text)["input_ids"] == [tok.bos_id] + tok.encode(text).tolist()
    for i, name in enumerate(extra):
        assert hf.convert_tokens_to_ids(name) == tok.vocab_size + i
        assert hf(f"a {name} b", add_special_tokens=False)["input_ids"].count(tok.vocab_size + i) == 1
    assert (hf.bos_token_id, hf.eos_token_id, hf.pad_token_id) == (tok.bos_id, tok.eos_id, tok.pad_id)


def test_byte_tokenizer_with_sentinels(tmp_path):
    _check_tokenizer(ByteTokenizer(), str(tmp_path), [f"<extra_id_{i}>" for i in range(3)])
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert hf("<s>", add_special_tokens=False)["input_ids"] == [63, 118, 65]   # text stays text, as in training


def _llama_style_sentencepiece():
    """SentencePiece's defaults (NFKC character map, whitespace collapsed, a dummy prefix), as a LLaMA-style
    .model a run may name in data.tokenizer."""
    import io

    import sentencepiece as spm

    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXTS), model_writer=model, vocab_size=500,
                                   model_type="bpe", byte_fallback=True, hard_vocab_limit=False, minloglevel=2)
    return SentencePieceTokenizer(model.getvalue())


@pytest.mark.parametrize("kind", ["ours", "llama_style"])
def test_sentencepiece_tokenizer_of_a_run(kind, tmp_path):
    """The codebase's own SentencePiece setup (BPE, byte fallback, whitespace kept, "\\n" a piece) and
    SentencePiece's defaults."""
    tok = train_sentencepiece(TEXTS, 400) if kind == "ours" else _llama_style_sentencepiece()
    _check_tokenizer(tok, str(tmp_path), [])


def test_tokenizer_json_of_a_run(tmp_path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rust = Tokenizer(models.BPE())
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    rust.decoder = decoders.ByteLevel()
    rust.train_from_iterator(TEXTS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<|endoftext|>"],
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    _check_tokenizer(HFTokenizer(rust.to_str()), str(tmp_path), ["[MASK]"])


def test_bad_input_is_named_before_anything_is_written(tiny_lm_run, tmp_path):
    out = str(tmp_path / "out")
    with pytest.raises(MissingInputError, match="does not exist"):
        export_run(str(tmp_path / "nothing"), out)
    no_ckpt = tmp_path / "no_ckpt"
    no_ckpt.mkdir()
    shutil.copy(os.path.join(tiny_lm_run, "config.json"), no_ckpt)
    with pytest.raises(MissingInputError, match="no checkpoint"):
        export_run(str(no_ckpt), out)
    with pytest.raises(MissingInputError, match="--step=3: no checkpoint"):
        export_run(tiny_lm_run, out, step=3)
    # the same run, but a GPT-2 shape with ALiBi: no Hugging Face family holds it
    alibi = tmp_path / "alibi"
    shutil.copytree(tiny_lm_run, alibi)
    config = json.loads((alibi / "config.json").read_text())
    config["model"]["positional"] = "alibi"
    (alibi / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="no Hugging Face counterpart"):
        export_run(str(alibi), out)
    assert not os.path.exists(out)
    os.makedirs(out)
    open(os.path.join(out, "keep.txt"), "w").close()
    with pytest.raises(ConfigError, match="exists and is not empty"):
        export_run(tiny_lm_run, out)
    assert os.listdir(out) == ["keep.txt"]


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "TRANSFORMER_HUGE_PAGES": "0", "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    return subprocess.run([sys.executable, "-m", "experiments.export", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_command_line(tiny_lm_run, tmp_path):
    r = _cli(f"--workdir={tiny_lm_run}", f"--out={tmp_path / 'hf'}", "--step=2")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[0])["step"] == 2
    assert transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf")).config.model_type == "gpt2"
    r = _cli(f"--workdir={tmp_path / 'missing'}", f"--out={tmp_path / 'hf2'}")
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].startswith("error: --workdir=")


def test_a_run_loads_and_exports_from_a_relative_path(tiny_lm_run, monkeypatch, tmp_path):
    """From Python, a run directory named relative to the working directory (orbax wants absolute paths: before,
    load_run('runs/x') failed inside orbax)."""
    from transformer.training.restore import load_run

    monkeypatch.chdir(os.path.dirname(tiny_lm_run))
    run = load_run(os.path.basename(tiny_lm_run))
    assert run.step == 4
    pytest.importorskip("transformers")
    from transformer.interop.export import export_run

    out = os.path.relpath(tmp_path / "hf", os.path.dirname(tiny_lm_run))
    assert export_run(os.path.basename(tiny_lm_run), out)["step"] == 4
    assert os.path.exists(tmp_path / "hf" / "model.safetensors")
