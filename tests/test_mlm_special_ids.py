"""The masked-LM task takes the special ids from the tokenizer (issue 19, hole 13): with a Hugging Face
tokenizer.json whose special tokens come after its regular ones, ids 0-2 are text and are masked like any
token, and the special tokens are never selected nor drawn as random replacements."""
from __future__ import annotations

import numpy as np
from test_data_files import _texts, data_config, write_mixed_folder

from transformer.data import mlm, tokenizers


def _tokenizer_with_specials_last(path: str, texts: list[str]) -> None:
    """A byte-level BPE tokenizer.json with few merges: regular tokens first (ids 0, 1, 2 are the characters
    !, ", #), then <|endoftext|> and <pad> as special tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=262, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer)
    tok.add_special_tokens(["<|endoftext|>", "<pad>"])
    tok.save(path)


def test_masked_lm_takes_the_special_ids_from_a_tokenizer_json(tmp_path):
    texts = [f'{t} "quoted"! #{i}' for i, t in enumerate(_texts(120))]
    path = str(tmp_path / "tokenizer.json")
    _tokenizer_with_specials_last(path, texts)
    tok = tokenizers.load_tokenizer_file(path)
    specials = {tok.eos_id, tok.pad_id}
    assert min(specials) >= 3 and [tok.decode([i]) for i in (0, 1, 2)] == ["!", '"', "#"]
    folder = str(tmp_path / "docs")
    write_mixed_folder(folder, texts)
    cfg = data_config(tmp_path, folder, tokenizer=path)
    it = mlm.make_mlm_iterator(cfg, split=cfg.train_split, global_batch_size=16, seed=0)
    selected, replaced = [], []
    for _ in range(20):
        b = next(it)
        chosen = b["weights"] > 0
        selected.append(b["targets"][chosen])
        swapped = chosen & (b["inputs"] != b["targets"]) & (b["inputs"] != mlm.mask_id(tok))
        replaced.append(b["inputs"][swapped])
    selected, replaced = np.concatenate(selected), np.concatenate(replaced)
    assert not set(selected.tolist()) & specials, "a special token (eos) was selected for masking"
    assert {0, 1, 2} & set(selected.tolist()), "the text tokens with ids 0-2 were never selected"
    assert len(replaced) and not set(replaced.tolist()) & specials, "a special id was drawn as a replacement"


def test_special_ids_of_each_kind_of_tokenizer(tmp_path):
    assert tokenizers.special_ids(tokenizers.ByteTokenizer()).tolist() == [0, 1, 2]
    path = str(tmp_path / "tokenizer.json")
    _tokenizer_with_specials_last(path, _texts(50))
    tok = tokenizers.load_tokenizer_file(path)
    assert tokenizers.special_ids(tok).tolist() == [tok.vocab_size - 2, tok.vocab_size - 1]
