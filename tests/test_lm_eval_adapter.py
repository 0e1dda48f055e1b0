"""The lm-evaluation-harness adapter (interop/lm_eval_model.py, issue 32 §3) against the harness's own HF backend on
the same local GPT-2 (tests/test_task_scoring.py's): loglikelihood, loglikelihood_rolling (texts longer than the
model's positions: several windows) and generate_until (greedy, stopped at `until`) give the same answers; and local
harness tasks of each kind run through it end to end (a run directory and the Hugging Face one)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
lm_eval = pytest.importorskip("lm_eval")

from test_task_scoring import LM_EVAL_YAML, gpt2_dir, write_task  # noqa: E402,F401 - the fixture

from lm_eval.api.instance import Instance  # noqa: E402
from lm_eval.models.huggingface import HFLM  # noqa: E402

from transformer.interop.lm_eval_model import TransformerLM  # noqa: E402

TEXTS = ("the cat sat on the mat and the dog ran to the park " * 3, "a blue sky", "far far away is very far\nnext")


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))


def _without_bos_template(path: str, tmp_path) -> str:
    """A copy of the Hugging Face directory whose tokenizer.json does not prepend bos (no post-processor)."""
    bare = tmp_path / "bare"
    shutil.copytree(path, bare)
    spec = json.loads((bare / "tokenizer.json").read_text())
    spec["post_processor"] = None
    (bare / "tokenizer.json").write_text(json.dumps(spec))
    return str(bare)


def _instances(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def test_each_request_kind_answers_as_the_harness_hf_backend(gpt2_dir, tmp_path):
    path, _ = gpt2_dir
    ours = TransformerLM(path, batch_size=4)
    theirs = HFLM(pretrained=path, add_bos_token=True, dtype="float32", device="cpu", batch_size=4)
    pairs = [("the cat", " sat"), ("a blue sky is ", "far"), ("", "the dog"), (TEXTS[0] * 2, " mat")]
    got, want = ours.loglikelihood(_instances("loglikelihood", pairs)), theirs.loglikelihood(
        _instances("loglikelihood", pairs))
    np.testing.assert_allclose([g for g, _ in got], [w for w, _ in want], atol=1e-4, rtol=0)
    assert [g for _, g in got] == [w for _, w in want]
    rolling = _instances("loglikelihood_rolling", [(t,) for t in TEXTS])
    assert len(TEXTS[0]) > ours.max_length  # several windows
    # The HF backend's rolling windows encode the text with the tokenizer's specials, and this tokenizer prepends
    # bos, which the backend would then score after its own bos prefix: the reference reads the same model through
    # a copy of the tokenizer without that template, so both score the text's tokens after bos.
    reference = HFLM(pretrained=_without_bos_template(path, tmp_path), dtype="float32", device="cpu", batch_size=4)
    np.testing.assert_allclose(ours.loglikelihood_rolling(rolling), reference.loglikelihood_rolling(rolling),
                               atol=1e-4, rtol=0)
    until = [("the cat", {"until": ["\n", "."], "max_gen_toks": 12}), ("far far", {"until": ["sky"], "max_gen_toks": 8})]
    assert ours.generate_until(_instances("generate_until", until)) == theirs.generate_until(
        _instances("generate_until", until))


@pytest.mark.slow
def test_local_harness_tasks_run_through_the_adapter(gpt2_dir, tiny_lm_run, tmp_path):
    """A multiple-choice, a rolling-loglikelihood and a generation task from local files, through
    lm_eval.simple_evaluate: on the Hugging Face directory the same metrics as the HF backend; on a run directory
    (bytes tokenizer, 32 positions) finite ones."""
    from lm_eval.tasks import TaskManager

    path, _ = gpt2_dir
    mc = write_task(str(tmp_path / "mc.jsonl"), docs=12, seed=4, per_choice_contexts=False)
    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": t, "prompt": t[:12], "answer": t[12:16]}) + "\n" for t in TEXTS))
    yaml = tmp_path / "yaml"
    yaml.mkdir()
    (yaml / "mc.yaml").write_text(LM_EVAL_YAML.format(name="toy_mc", path=mc))
    common = f"dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {texts}\ntest_split: test\n"
    (yaml / "roll.yaml").write_text(f"task: toy_roll\n{common}output_type: loglikelihood_rolling\n"
                                    "doc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n  - metric: "
                                    "word_perplexity\n  - metric: bits_per_byte\n")
    (yaml / "gen.yaml").write_text(f"task: toy_gen\n{common}output_type: generate_until\ndoc_to_text: '{{{{prompt}}}}'\n"
                                   "doc_to_target: '{{answer}}'\ngeneration_kwargs:\n  until: ['\\n']\n"
                                   "  max_gen_toks: 6\n  do_sample: false\nmetric_list:\n  - metric: exact_match\n")
    tasks = ["toy_mc", "toy_roll", "toy_gen"]
    manager = TaskManager(include_path=str(yaml))

    def results(model, names=tasks):
        return lm_eval.simple_evaluate(model=model, tasks=list(names), task_manager=manager)["results"]

    ours = results(TransformerLM(path, batch_size=4))
    theirs = results(HFLM(pretrained=path, add_bos_token=True, dtype="float32", device="cpu", batch_size=4),
                     ["toy_mc", "toy_gen"])
    theirs.update(results(HFLM(pretrained=_without_bos_template(path, tmp_path), dtype="float32", device="cpu",
                               batch_size=4), ["toy_roll"]))  # the rolling reference (see the test above)
    for task, metric in (("toy_mc", "acc,none"), ("toy_mc", "acc_norm,none"), ("toy_gen", "exact_match,none")):
        assert ours[task][metric] == theirs[task][metric], (task, metric)
    for metric in ("word_perplexity,none", "bits_per_byte,none"):
        assert ours["toy_roll"][metric] == pytest.approx(theirs["toy_roll"][metric], rel=1e-4)
    run = results(TransformerLM(tiny_lm_run, batch_size=4))
    assert np.isfinite(run["toy_roll"]["bits_per_byte,none"]) and 0 <= run["toy_mc"]["acc,none"] <= 1
