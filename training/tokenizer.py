"""The byte-level BPE tokenizer of the default model.

Owns training it on the corpus and wrapping it as a Hugging Face fast tokenizer. Byte-level
BPE with no normalizer and no prefix space round-trips any UTF-8 text exactly, which the
engine relies on when it streams decoded text.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOT = "<|endoftext|>"  # separates files in training; bos, eos and pad of the saved tokenizer


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """Train byte-level BPE on `texts`; the special token EOT gets id 0."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    assert tok.token_to_id(EOT) == 0, "EOT must be id 0: the model config assumes it"
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOT,
        eos_token=EOT,
        pad_token=EOT,
        clean_up_tokenization_spaces=False,  # True would rewrite " ." to "." and break round-trip
        model_max_length=1024,
    )
