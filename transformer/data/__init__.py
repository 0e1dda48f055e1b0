"""Data: the built-in TFDS corpus (or any TFDS text dataset), tokenizers, grain LM pipelines."""
from transformer.data.corpus import corpus_metadata, load_split
from transformer.data.pipeline import local_batch_size, make_lm_dataset, make_lm_iterator, unigram_entropy
from transformer.data.tokenizers import ByteTokenizer, SentencePieceTokenizer, Tokenizer, get_tokenizer

__all__ = [
    "ByteTokenizer", "SentencePieceTokenizer", "Tokenizer", "corpus_metadata", "get_tokenizer",
    "load_split", "local_batch_size", "make_lm_dataset", "make_lm_iterator", "unigram_entropy",
]
