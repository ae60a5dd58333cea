"""A text prompt that already begins with the tokenizer's BOS text (a chat template rendered
outside the engine, as the Playground does) is not given a second BOS; any other text is
tokenized with the tokenizer's special tokens as usual."""

from __future__ import annotations

from engine.inputs import prompt_ids


class BosTokenizer:
    """Adds id 1 (its BOS, text "<s>") in front unless told not to; one id per character."""

    bos_token = "<s>"

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict:
        ids = []
        while text:
            if text.startswith(self.bos_token or "\0"):
                ids.append(1)
                text = text[3:]
            else:
                ids.append(10 + ord(text[0]) % 50)
                text = text[1:]
        return {"input_ids": ([1] if add_special_tokens else []) + ids}


def test_a_templated_prompt_keeps_one_bos_and_plain_text_gets_one():
    tok = BosTokenizer()
    templated = prompt_ids("<s>hi", tok, vocab_size=100, max_model_len=64)
    plain = prompt_ids("hi", tok, vocab_size=100, max_model_len=64)
    assert templated.count(1) == 1 and templated[0] == 1
    assert plain[0] == 1 and plain.count(1) == 1
    assert templated[1:] == plain[1:]


def test_a_tokenizer_without_bos_is_called_as_before():
    class NoBos(BosTokenizer):
        bos_token = None

    ids = prompt_ids("hi", NoBos(), vocab_size=100, max_model_len=64)
    assert ids[0] == 1 and len(ids) == 3  # the tokenizer's own special tokens, as before
