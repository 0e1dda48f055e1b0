"""A training run (or a local Hugging Face decoder directory) as an lm-evaluation-harness model (extra `[eval]`:
lm-eval 0.4), so that any harness task runs against it:

    import lm_eval
    from transformer.interop.lm_eval_model import TransformerLM
    lm_eval.simple_evaluate(model=TransformerLM("runs/llama_tiny"), tasks=["lambada_openai"])

or, once this module is imported, `model="transformer", model_args="pretrained=runs/llama_tiny,batch_size=32"`.

  loglikelihood          (context, continuation) pairs encoded as the harness's HF backend encodes them with
                         add_bos_token=True (scoring_rows.encode_pair), packed into rows and scored by the one
                         compiled scoring step (training/scoring.Scorer): (loglikelihood, is_greedy) per request
  loglikelihood_rolling  a text's loglikelihood over the harness's disjoint rolling windows of the row length
                         (utils.get_rolling_token_windows with bos as the prefix token, context length 1), every
                         window of every text scored in the same packed rows
  generate_until         the KV-cache sampler (inference/generate.py), requests batched `batch_size` at a time:
                         greedy unless the request asks for do_sample with a temperature; the prompt keeps its last
                         seq_len − max_gen_toks tokens; the text is cut at the first of `until` (eos stops the row)
"""
from __future__ import annotations

from typing import Any

import jax
import numpy as np
from lm_eval import utils
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model

from transformer.data import scoring_rows
from transformer.inference.generate import generate
from transformer.inference.sampling import SamplingConfig
from transformer.interop import scoring_model
from transformer.spec import ConfigError
from transformer.training.scoring import Scorer


@register_model("transformer")
class TransformerLM(LM):
    """`pretrained`: a run directory or a Hugging Face decoder directory (interop/scoring_model.py); `batch_size`:
    rows scored (and prompts generated) at once; `seq_len`: the row length (0: the model's); `step`: a run's
    checkpoint; `max_gen_toks`: generate_until's default number of new tokens; `seed`: sampling's."""

    def __init__(self, pretrained: str, batch_size: int | str = 16, seq_len: int = 0, step: int | None = None,
                 max_gen_toks: int = 256, seed: int = 0, **kwargs: Any):
        super().__init__()
        self.loaded = scoring_model.load(str(pretrained), step=None if step in (None, "") else int(step),
                                         seq_len=int(seq_len), setting="pretrained")
        if self.loaded.family != "decoder":  # rolling windows and the sampler here are a decoder's
            raise ConfigError(f"pretrained={pretrained}: a model.family={self.loaded.family!r} model; this adapter "
                              "takes decoders (experiments.evaluate scores an encoder–decoder's multiple-choice tasks)")
        self.batch_size = 16 if batch_size == "auto" else int(batch_size)
        self.max_gen_toks, self.seed = int(max_gen_toks), int(seed)
        self.tokenizer = self.loaded.tokenizer
        self.scorer = Scorer(self.loaded.model, self.loaded.task, self.loaded.layout, self.batch_size)

    @property
    def max_length(self) -> int:
        return self.loaded.seq_len

    def _score(self, requests: list[scoring_rows.Request]) -> tuple[np.ndarray, np.ndarray]:
        return self.scorer.loglikelihoods(self.loaded.params, requests)

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        encoded = [scoring_rows.encode_pair(self.tokenizer, *req.args) for req in requests]
        ll, greedy = self._score([(c, x) for c, x, _ in encoded])
        return [(float(a), bool(b)) for a, b in zip(ll, greedy)]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, req in enumerate(requests):
            tokens = [int(t) for t in self.tokenizer.encode(req.args[0])]
            for window in utils.get_rolling_token_windows(token_list=tokens, prefix_token=self.tokenizer.bos_id,
                                                          max_seq_len=self.max_length, context_len=1):
                windows.append(utils.make_disjoint_window(window))
                owner.append(i)
        totals = np.zeros(len(requests), np.float64)
        if windows:
            ll, _ = self._score(windows)
            np.add.at(totals, np.asarray(owner), ll)
        return [float(t) for t in totals]

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        tok, out = self.tokenizer, []
        rng = jax.random.PRNGKey(self.seed)
        for start in range(0, len(requests), self.batch_size):
            chunk = requests[start:start + self.batch_size]
            kwargs = [dict(req.args[1]) if len(req.args) > 1 else {} for req in chunk]
            new = max(int(k.get("max_gen_toks", self.max_gen_toks)) for k in kwargs)
            new = min(new, self.max_length - 1)
            keep = self.max_length - new
            prompts = [([tok.bos_id] + [int(t) for t in tok.encode(req.args[0])])[-keep:] for req in chunk]
            temperature = max(float(k.get("temperature", 0.0)) if k.get("do_sample") else 0.0 for k in kwargs)
            rng, key = jax.random.split(rng)
            generated = generate(self.loaded.model, self.loaded.params, prompts, max_new_tokens=new, rng=key,
                                 sampling=SamplingConfig(temperature=temperature), stop_tokens=[tok.eos_id],
                                 pad_id=tok.pad_id)
            for ids, k in zip(generated.sequences(), kwargs):
                limit = int(k.get("max_gen_toks", self.max_gen_toks))
                text = tok.decode([i for i in ids[:limit] if i != tok.eos_id])
                until = k.get("until") or []
                for stop in [until] if isinstance(until, str) else until:
                    if stop:
                        text = text.split(stop)[0]
                out.append(text)
        return out
