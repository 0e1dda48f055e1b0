"""Data: the built-in TFDS corpus (or any TFDS text dataset) or local files, tokenizers, the token cache,
batches by global index."""
from transformer.data.batches import BatchIterator, local_batch_size
from transformer.data.corpus import corpus_metadata, load_split
from transformer.data.pipeline import make_lm_iterator, unigram_entropy
from transformer.data.tokenizers import (ByteTokenizer, HFTokenizer, SentencePieceTokenizer, Tokenizer, get_tokenizer,
                                         record_tokenizer)

__all__ = [
    "BatchIterator", "ByteTokenizer", "HFTokenizer", "SentencePieceTokenizer", "Tokenizer", "corpus_metadata",
    "get_tokenizer", "load_split", "local_batch_size", "make_lm_iterator", "record_tokenizer", "unigram_entropy",
]
