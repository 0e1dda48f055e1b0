"""Encoder–decoder likelihood scoring checked against `transformers` (issue 32 §2): on a T5 made here (a tiny random
T5ForConditionalGeneration, the bytes tokenizer as tokenizer.json: nothing from a hub) imported through
transformer.interop, every multiple-choice request — the context to the encoder, the choice scored by the decoder,
several requests packed to a row on both sides — has the loglikelihood `transformers` gives it alone (1e-4), and
experiments.evaluate's metrics follow from those; an encoder–decoder run scores its tasks in the loop as the command
scores its checkpoint (slow)."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checks import perturbed  # noqa: E402
from test_task_scoring import write_task  # noqa: E402

from cli_modules import cli_module  # noqa: E402
from transformer.data import choice_tasks, scoring_rows  # noqa: E402
from transformer.data.tokenizers import ByteTokenizer  # noqa: E402
from transformer.interop import scoring_model  # noqa: E402
from transformer.interop.hf_tokenizer import save_tokenizer  # noqa: E402
from transformer.training.scoring import Scorer  # noqa: E402

ROW = 48  # the encoder's and the decoder's rows


@pytest.fixture(scope="module")
def t5_dir(tmp_path_factory):
    """A local Hugging Face T5 directory: a random 2+2-layer model over the bytes tokenizer's 259 ids."""
    d = str(tmp_path_factory.mktemp("t5"))
    config = transformers.T5Config(vocab_size=259, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_decoder_layers=2,
                                   num_heads=4, feed_forward_proj="relu", relative_attention_num_buckets=8,
                                   relative_attention_max_distance=20, dropout_rate=0.0, pad_token_id=0,
                                   eos_token_id=2, decoder_start_token_id=0)
    hf = perturbed(transformers.T5ForConditionalGeneration, config, scale=0.2)
    hf.save_pretrained(d)
    save_tokenizer(ByteTokenizer(), d)
    return d, hf


def _reference(hf, context: list[int], continuations: list[list[int]]) -> list[tuple[float, bool]]:
    """`transformers`' (loglikelihood, is_greedy) of each continuation of one context, as lm-evaluation-harness's
    seq2seq call makes it: input_ids the context's last ROW tokens, labels the continuation (the continuations of a
    context in one call, right-padded with -100: the decoder is causal, so a padded label changes nothing before it)."""
    width = max(len(c) for c in continuations)
    labels = torch.tensor([c + [-100] * (width - len(c)) for c in continuations])
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor([context[-ROW:]] * len(continuations)), labels=labels).logits.double()
    out = []
    for logits_TV, cont in zip(logits, continuations):
        logp = torch.log_softmax(logits_TV[:len(cont)], -1)
        targets = torch.tensor(cont)
        out.append((float(logp[torch.arange(len(cont)), targets].sum()), bool((logp.argmax(-1) == targets).all())))
    return out


def _references(hf, requests: list[tuple[list[int], list[int]]]) -> list[tuple[float, bool]]:
    """_reference of every request, the requests of one context together, in the requests' order."""
    by_context: dict[tuple, list[int]] = {}
    for i, (ctx, _) in enumerate(requests):
        by_context.setdefault(tuple(ctx), []).append(i)
    out: list = [None] * len(requests)
    for ctx, members in by_context.items():
        for i, r in zip(members, _reference(hf, list(ctx), [list(requests[i][1]) for i in members])):
            out[i] = r
    return out


def test_every_encoder_decoder_loglikelihood_equals_transformers(t5_dir, tmp_path):
    path, hf = t5_dir
    loaded = scoring_model.load(path, seq_len=ROW)
    assert loaded.family == "encoder_decoder" and loaded.layout == scoring_rows.Layout(ROW, ROW, decoder_start=0)
    assert loaded.seq_len == ROW and loaded.task.name == "span_corruption"
    task_file = write_task(str(tmp_path / "toy.jsonl"))
    task = choice_tasks.load("toy", task_file)
    encoded = [loaded.layout.encode(loaded.tokenizer, c, x) for c, x in task.requests()]
    assert all(c[-1] == loaded.tokenizer.eos_id for c, _, _ in encoded)  # the context ends as T5's template ends it
    requests = [(c, x) for c, x, _ in encoded]
    packed = loaded.layout.pack(requests)
    assert packed.num_rows < len(requests) and (packed.features["target_segment_ids"].max(1) >= 2).sum() > 5
    assert packed.truncated == len(task.docs[1].continuations)  # the long context: its last ROW tokens
    ll, greedy = Scorer(loaded.model, loaded.task, loaded.layout, batch_size=3).score_rows(loaded.params, packed)[0]
    reference = _references(hf, requests)
    np.testing.assert_allclose(ll, [r for r, _ in reference], atol=1e-4, rtol=0)
    assert list(greedy) == [g for _, g in reference]
    assert np.ptp(ll) > 5  # loglikelihoods that differ: a comparison that tells something


@pytest.mark.slow
def test_the_command_scores_a_hugging_face_t5_as_transformers_would(t5_dir, tmp_path):
    path, hf = t5_dir
    task_file = write_task(str(tmp_path / "toy.jsonl"))
    task, tokenizer = choice_tasks.load("toy", task_file), ByteTokenizer()
    encoded = [scoring_rows.encode_seq2seq_pair(tokenizer, c, x) for c, x in task.requests()]
    reference = np.array([ll for ll, _ in _references(hf, [(c, x) for c, x, _ in encoded])])
    expected = choice_tasks.metrics(task, reference, [s for _, _, s in encoded])
    out = cli_module("evaluate").evaluate(path, f"toy={task_file}", batch_size=4, seq_len=ROW)
    assert out["model"]["family"] == "encoder_decoder"
    got = out["tasks"]["toy"]
    assert (got["acc"], got["acc_norm"], got["docs"]) == (expected["acc"], expected["acc_norm"], expected["docs"])
    assert got["bits_per_byte"] == pytest.approx(expected["bits_per_byte"], rel=1e-5)


def test_the_seq2seq_rows_keep_each_request_in_its_segment():
    """Packing on both sides: request k of a row is segment k of its encoder row and of its decoder row, its decoder
    inputs the start id then its continuation shifted; a context longer than the encoder row keeps its end."""
    requests = [([5, 6, 7, 2], [8, 9]), ([10, 2], [11, 12, 13]), (list(range(20, 31)) + [2], [14])]
    packed = scoring_rows.pack_seq2seq(requests, source_len=8, target_len=6, decoder_start=0)
    f = packed.features
    assert packed.num_rows == 2 and packed.truncated == 1
    assert f["inputs"][0].tolist() == [24, 25, 26, 27, 28, 29, 30, 2]  # the longest alone: its last 8 tokens
    assert f["input_segment_ids"][1].tolist() == [1, 1, 1, 1, 2, 2, 0, 0]  # the other two share a row
    for r in range(packed.num_rows):
        for seg in range(1, f["target_segment_ids"][r].max() + 1):
            tgt = f["target_segment_ids"][r] == seg
            req = packed.request_RT[r][tgt]
            assert len(set(req.tolist())) == 1
            ctx, cont = requests[req[0]]
            assert f["targets"][r][tgt].tolist() == cont
            assert f["decoder_inputs"][r][tgt].tolist() == [0] + cont[:-1]
            assert f["inputs"][r][f["input_segment_ids"][r] == seg].tolist() == ctx[-8:]
            src = f["input_segment_ids"][r] == seg  # positions restart at 0 in each segment, on both sides
            assert f["input_positions"][r][src].tolist() == list(range(len(ctx[-8:])))
            assert f["target_positions"][r][tgt].tolist() == list(range(len(cont)))
    assert (f["weights"] == (f["target_segment_ids"] > 0)).all()  # every continuation token scored, padding not
    assert (packed.request_RT >= 0).sum() == sum(len(c) for _, c in requests)
    for key in ("inputs", "input_positions"):
        assert (f[key][f["input_segment_ids"] == 0] == 0).all(), key  # padding is zeros


@pytest.mark.slow
def test_an_encoder_decoder_run_scores_its_tasks_in_the_loop_as_the_command_does(corpus_dir, tmp_path):
    from configs import seq2seq
    from transformer.training import loop

    task_file = write_task(str(tmp_path / "toy.jsonl"), docs=10)
    c = seq2seq.get_config("t5_tiny")
    c.data.data_dir, c.data.seq_len = corpus_dir, 32
    c.train.update(steps=4, batch_size=8, warmup_steps=1, log_every=2, eval_every=4, eval_steps=1, checkpoint_every=4)
    c.train.eval_tasks = f"toy={task_file}"
    workdir = str(tmp_path / "run")
    summary = loop.train(c, workdir, verbose=False)
    assert summary["status"] == "ok" and set(summary["tasks"]["toy"]) == set(choice_tasks.METRICS)
    alone = cli_module("evaluate").evaluate(workdir, f"toy={task_file}", batch_size=3)["tasks"]["toy"]
    assert alone["docs"] == summary["tasks"]["toy"]["docs"]
    for m in ("acc", "acc_norm"):
        assert summary["tasks"]["toy"][m] == alone[m], m
    assert summary["tasks"]["toy"]["bits_per_byte"] == pytest.approx(alone["bits_per_byte"], rel=1e-5)


def test_a_layout_follows_the_task_and_the_models_decoder_start():
    from transformer.data.span_corruption import DECODER_START_ID
    from transformer.training.scoring import layout_for

    assert layout_for("lm", 16) == scoring_rows.Layout(16)
    assert layout_for("span_corruption", 16) == scoring_rows.Layout(16, 16, decoder_start=DECODER_START_ID)
    assert layout_for("span_corruption", 16, decoder_start=7).decoder_start == 7  # a Hugging Face model's own
