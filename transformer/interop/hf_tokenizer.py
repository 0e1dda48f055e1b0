"""A run's tokenizer as a Hugging Face tokenizer (tokenizer.json + tokenizer_config.json) that
`transformers.AutoTokenizer.from_pretrained(PATH)` loads and that gives the run's ids.

  bytes             a byte-level BPE with no merges: byte b is id b + 3 (as ByteTokenizer), <pad> <s> </s>
                    are ids 0, 1, 2 (GPT-2's byte-to-character table, so any UTF-8 text round-trips);
  SentencePiece     a BPE model (tokenizers) with the SentencePiece model's pieces, the merges they imply
                    (ordered by score, as transformers' converter does), byte fallback, "▁" for spaces and
                    user-defined pieces such as "\\n" as added tokens;
  tokenizer.json    the run's file, its special tokens kept.
`tokenizer(text)` prepends the run's bos, as every training document began with it (so
`AutoModelForCausalLM` sees what the run's model saw; add_special_tokens=False gives the bare ids).
Text that spells a special token ("<s>") stays text for bytes and SentencePiece, as in training (except
in a masked LM's tokenizer, where "[MASK]" in the text is the mask, as BERT users write it); a
tokenizer.json keeps its own rule. `extra_tokens` are the task's ids past the tokenizer's vocabulary
(span corruption's sentinels <extra_id_i>, the masked LM's [MASK]), appended in order.
Every conversion is checked on a probe text (code, Unicode, runs of spaces, tabs, newlines) against the
run's tokenizer before anything is written; a difference is an error, never a silently other tokenizer.
"""
from __future__ import annotations

from typing import Any, Sequence

from transformer.spec import ConfigError
from transformer.data.tokenizers import ByteTokenizer, HFTokenizer, SentencePieceTokenizer, Tokenizer

PROBE = ("def f(x):\n    return {'a': x ** 2}  # comment\n\n\tclass Ünïcödé:  pass\r\n"
         "    spaces   and\ttabs\n\n\n 世界 ∑ 🙂 naïve café — “quotes” 1234567890\n")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (what the ByteLevel pre-tokenizer maps bytes to)."""
    bs = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def _byte_level(tok: ByteTokenizer) -> tuple[Any, dict[str, str]]:
    from tokenizers import AddedToken, Tokenizer as RustTokenizer, decoders, models, pre_tokenizers

    table = _bytes_to_unicode()
    specials = {"<pad>": tok.pad_id, "<s>": tok.bos_id, "</s>": tok.eos_id}
    vocab = dict(specials, **{table[b]: b + ByteTokenizer._OFFSET for b in range(256)})
    rust = RustTokenizer(models.BPE(vocab=vocab, merges=[]))
    rust.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    rust.decoder = decoders.ByteLevel()
    rust.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    return rust, dict(pad_token="<pad>", bos_token="<s>", eos_token="</s>", split_special_tokens=True)


def _bpe_merges(pieces: list[tuple[str, float]]) -> list[tuple[str, str]]:
    """The merges a SentencePiece BPE model implies: every split of a piece into two pieces, the piece with
    the higher score merged first (ties: shorter left part first), as transformers' converter orders them."""
    vocab = {piece: i for i, (piece, _) in enumerate(pieces)}
    merges = []
    for piece, score in pieces:
        splits = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(left, right, score) for left, right in sorted(splits, key=lambda lr: (vocab[lr[0]], vocab[lr[1]]))]
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _sentencepiece(tok: SentencePieceTokenizer) -> tuple[Any, dict[str, str]]:
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Tokenizer as RustTokenizer, decoders, models, normalizers

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(tok.model_proto)
    spec = proto.trainer_spec
    if spec.model_type != spec.BPE:
        raise ConfigError("only BPE SentencePiece models convert to a Hugging Face tokenizer here (this one is "
                          f"{spec.ModelType.Name(spec.model_type)})")
    pieces = [(p.piece, p.score) for p in proto.pieces]
    unk = proto.pieces[spec.unk_id].piece if spec.unk_id >= 0 else None
    rust = RustTokenizer(models.BPE(vocab={p: i for i, (p, _) in enumerate(pieces)}, merges=_bpe_merges(pieces),
                                    unk_token=unk, fuse_unk=True, byte_fallback=spec.byte_fallback))
    norm = proto.normalizer_spec  # in SentencePiece's order: character map, whitespace, dummy prefix, "▁"
    steps = [normalizers.Precompiled(norm.precompiled_charsmap)] if norm.precompiled_charsmap else []
    if norm.remove_extra_whitespaces:
        from tokenizers import Regex
        steps += [normalizers.Strip(left=True, right=True), normalizers.Replace(Regex(" {2,}"), " ")]
    if norm.add_dummy_prefix:
        steps.append(normalizers.Prepend(" "))
    rust.normalizer = normalizers.Sequence(steps + [normalizers.Replace(" ", "▁")])
    rust.decoder = decoders.Sequence([decoders.Replace("▁", " ")]
                                     + ([decoders.ByteFallback()] if spec.byte_fallback else []) + [decoders.Fuse()]
                                     + ([decoders.Strip(" ", 1, 0)] if norm.add_dummy_prefix else []))
    rust.add_tokens([AddedToken(p.piece, normalized=False, special=False) for p in proto.pieces
                     if p.type == p.USER_DEFINED])
    rust.add_special_tokens([AddedToken(p.piece, normalized=False, special=True) for p in proto.pieces
                             if p.type == p.CONTROL])
    names = {"pad_token": tok.pad_id, "bos_token": tok.bos_id, "eos_token": tok.eos_id}
    specials = {k: proto.pieces[i].piece for k, i in names.items()}
    if unk is not None:
        specials["unk_token"] = unk
    return rust, dict(specials, split_special_tokens=True)


def _tokenizer_json(tok: HFTokenizer) -> tuple[Any, dict[str, str]]:
    from tokenizers import Tokenizer as RustTokenizer

    rust = RustTokenizer.from_str(tok.json_text)
    names = {"pad_token": tok.pad_id, "bos_token": tok.bos_id, "eos_token": tok.eos_id}
    return rust, {k: rust.id_to_token(i) for k, i in names.items()}


def to_hf_tokenizer(tok: Tokenizer, extra_tokens: Sequence[str] = (), mask_token: str | None = None) -> Any:
    """A transformers PreTrainedTokenizerFast giving `tok`'s ids (bos prepended by `tokenizer(text)`)."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    if isinstance(tok, ByteTokenizer):
        rust, kwargs = _byte_level(tok)
    elif isinstance(tok, SentencePieceTokenizer):
        rust, kwargs = _sentencepiece(tok)
    elif isinstance(tok, HFTokenizer):
        rust, kwargs = _tokenizer_json(tok)
    else:
        raise ConfigError(f"a {type(tok).__name__} has no Hugging Face tokenizer here; bytes, SentencePiece and "
                          "tokenizer.json runs have")
    if rust.get_vocab_size(with_added_tokens=True) != tok.vocab_size:
        raise ValueError(f"the converted tokenizer has {rust.get_vocab_size(with_added_tokens=True)} ids, the run's "
                         f"{tok.vocab_size}")
    for i, name in enumerate(extra_tokens):  # ids vocab_size + i, in order
        rust.add_tokens([AddedToken(name, normalized=False, special=name == mask_token)])
        if rust.token_to_id(name) != tok.vocab_size + i:
            raise ValueError(f"{name} got id {rust.token_to_id(name)}, not {tok.vocab_size + i}")
    bos = kwargs["bos_token"]
    rust.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A $B:1",
                                                        special_tokens=[(bos, tok.bos_id)])
    if mask_token is not None:  # "[MASK]" in the text must become the mask (a masked LM's usage): specials parse
        kwargs.update(mask_token=mask_token, split_special_tokens=False)
    hf = PreTrainedTokenizerFast(tokenizer_object=rust, **kwargs)
    ids = hf(PROBE, add_special_tokens=False)["input_ids"]
    expected = tok.encode(PROBE).tolist()
    if ids != expected:
        i = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), min(len(ids), len(expected)))
        raise ValueError(f"the Hugging Face tokenizer does not reproduce the run's ids on the probe text: first "
                         f"difference at token {i}: {ids[i:i + 5]} against {expected[i:i + 5]}")
    if hf(PROBE)["input_ids"] != [tok.bos_id] + expected:
        raise ValueError("the Hugging Face tokenizer does not prepend the run's bos")
    return hf


def save_tokenizer(tok: Tokenizer, path: str, extra_tokens: Sequence[str] = (), mask_token: str | None = None) -> str:
    """Writes PATH/tokenizer.json and PATH/tokenizer_config.json (see the module docstring); returns PATH."""
    to_hf_tokenizer(tok, extra_tokens, mask_token).save_pretrained(path)
    return path
