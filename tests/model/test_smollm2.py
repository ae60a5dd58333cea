"""The default model, SmolLM2-135M-Instruct converted by scripts/fetch_default_model.py.

What a user would notice: asked a factual question through its chat template, the engine's
greedy reply is right and ends at the chat's end token (EOS from the generation config); the
converted folder computes what transformers computes from the GGUF it came from; the
dashboard's own template rendering (ui.widgets.chat_prompt, no torch) gives the tokenizer's prompt.

Skips, saying why, when the converted folder is missing (scripts/setup.sh makes it; CI runs
setup.sh first, so there it is present).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.model.loader import load_model_and_tokenizer
from engine.model.scoring import sequence_logits
from ui.widgets.chat_prompt import load_chat_template

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "models" / "SmolLM2-135M-Instruct"
GGUF = MODEL_DIR / "SmolLM2-135M-Instruct.Q4_1.gguf"

if not (MODEL_DIR / "model.safetensors").is_file():
    pytest.skip(
        f"{MODEL_DIR.relative_to(ROOT)} is missing: run `bash scripts/setup.sh` (it downloads "
        "and converts the default model)",
        allow_module_level=True,
    )

pytestmark = pytest.mark.slow
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# A fixed prompt with a system turn, a multi-turn history and code: 60-odd tokens.
FIXED_PROMPT = (
    "<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nReverse a string in "
    "Python.<|im_end|>\n<|im_start|>assistant\nUse slicing: `s[::-1]`.<|im_end|>\n"
    "<|im_start|>user\nAnd a list?<|im_end|>\n<|im_start|>assistant\n"
)


def default_config(**overrides: object) -> EngineConfig:
    settings = {"device": "cpu", "max_num_seqs": 2, **overrides}
    cfg = EngineConfig.from_yaml(ROOT / "config.yaml", **settings)
    assert Path(cfg.model).resolve() == MODEL_DIR.resolve(), "config.yaml's default changed"
    return cfg


def test_config_yaml_points_at_the_converted_folder() -> None:
    default_config()


def test_engine_answers_through_the_chat_template() -> None:
    with Engine(default_config()) as eng:
        prompt = eng.tokenizer.apply_chat_template(QUESTION, tokenize=False,
                                                   add_generation_prompt=True)
        out = eng.generate([prompt], SamplingParams(max_tokens=48, temperature=0.0))[0]
    assert "Paris" in out.text, out.text
    # It stopped at <|im_end|>, the generation config's EOS, well before max_tokens.
    assert out.finish_reason == "stop" and len(out.token_ids) < 48, out
    assert "<|im_end|>" not in out.text


def test_dashboard_template_rendering_matches_the_tokenizer() -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(MODEL_DIR))
    template = load_chat_template(MODEL_DIR)
    assert template is not None
    conversations = [
        QUESTION,
        [{"role": "system", "content": "Answer briefly."}, *QUESTION,
         {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}],
    ]
    for messages in conversations:
        want = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert template.render(messages) == want


@pytest.mark.cuda
def test_engine_answers_on_the_gpu_in_bf16() -> None:
    """The dashboard's GPU default (dtype auto: bf16, triton attention, CUDA graphs)."""
    with Engine(default_config(device="cuda")) as eng:
        assert eng.settings()["dtype"] == "bfloat16"
        prompt = eng.tokenizer.apply_chat_template(QUESTION, tokenize=False,
                                                   add_generation_prompt=True)
        out = eng.generate([prompt], SamplingParams(max_tokens=48, temperature=0.0))[0]
    assert "Paris" in out.text and out.finish_reason == "stop", out


@pytest.fixture(scope="module")
def gguf_model() -> torch.nn.Module:
    pytest.importorskip("gguf", reason="the gguf package is missing (requirements.txt)")
    pytest.importorskip("accelerate", reason="accelerate is missing (requirements.txt): "
                        "from_pretrained(gguf_file=...) refuses to run without it")
    from transformers import AutoModelForCausalLM

    if not GGUF.is_file():
        pytest.skip(f"{GGUF.name} is missing from the folder: delete "
                    f"{MODEL_DIR.relative_to(ROOT)} and run scripts/setup.sh again")
    import gguf

    # transformers parses the GGUF afresh for the config and again for the weights (~4 s
    # each on a 2-core CPU); the second parse would read the same file: one serves both.
    parsed: dict[tuple[str, str], object] = {}
    parse = gguf.GGUFReader

    def read_once(path, mode="r"):  # noqa: ANN001, ANN202 (gguf's signature)
        key = (str(path), mode)
        if key not in parsed:
            parsed[key] = parse(path, mode)
        return parsed[key]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf, "GGUFReader", read_once)
        model = AutoModelForCausalLM.from_pretrained(
            str(MODEL_DIR), gguf_file=GGUF.name, dtype=torch.float32, attn_implementation="sdpa")
    return model.eval()


@pytest.fixture(scope="module")
def converted() -> tuple[torch.nn.Module, object]:
    cfg = default_config(dtype="float32")
    return load_model_and_tokenizer(cfg, torch.device("cpu"), torch.float32)


def test_converted_weights_are_the_gguf_weights(gguf_model, converted) -> None:
    model, _ = converted
    ours, theirs = model.state_dict(), gguf_model.state_dict()
    assert ours.keys() == theirs.keys()
    for name, tensor in theirs.items():
        assert torch.equal(ours[name], tensor), name


@torch.inference_mode()
def test_logits_match_transformers_loading_the_gguf(gguf_model, converted) -> None:
    model, tok = converted
    ids = tok(FIXED_PROMPT)["input_ids"]
    assert 40 < len(ids) < 200
    want = gguf_model(torch.tensor([ids])).logits[0].float()
    got = sequence_logits(model, ids)  # the engine's loader and paged attention, fp32
    assert got.shape == want.shape
    diff = (got - want).abs().max().item()
    # The difference is a few 1e-5 with logits up to about 40: the attention kernels differ
    # (paged reference vs sdpa), the weights do not.
    assert diff < 2e-4, f"max |logit difference| {diff:.2e}"
    assert torch.equal(got.argmax(-1), want.argmax(-1))
