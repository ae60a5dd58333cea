"""Engine and sampling settings: what each knob means, what values it allows, and loading them.

Owns validation at the boundary: every unknown key or invalid value raises ValueError naming
the key and what is allowed. Nothing here touches a device, a model or the UI.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

INT32_MAX = 2**31 - 1  # top_k, seeds and token ids travel to the device as int32
FLOAT32_MAX = 3.4e38  # temperature travels as float32
# Stop strings a request may carry, and their length (OpenAI allows 4 stop strings): matching
# costs the same whatever their number, but building the matcher and holding text back do not.
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256

DEVICES = ("cpu", "cuda", "auto")
DTYPES = ("auto", "float32", "float16", "bfloat16")
ATTENTION_BACKENDS = ("auto", "torch", "triton")
MODEL_IMPLS = ("auto", "gapless", "transformers")
# The decode layer of model_impl gapless (engine.model.llama.FusedPath runs it): cuBLAS GEMMs
# with separate norm/SiLU/rotary kernels; the fused Triton GEMMs wherever they fit; or per GEMM
# shape whichever engine/model/gemm_table.json measured faster.
DECODE_LAYERS = ("cublas", "fused", "auto")
BLAS_LIBRARIES = ("auto", "default", "cublas", "cublaslt")
PDL_OVERLAPS = ("late", "early", "prefetch")
# Keys that no longer exist, and what replaces them (a config that still has one gets this).
RETIRED_KEYS = {
    "fused_layer": "fused_layer is now decode_layer, one of 'cublas', 'fused', 'auto' (plain: "
                   "cublas; five: fused; six: fused with fused_rotary: false; auto: auto; "
                   "epilogues and persistent are gone)",
}

# The live settings: the dashboard and clients change these while the engine serves
# (Engine.configure). The one list of their names and legal values; everything else imports it.
NUM_SLOTS = (1, 2, 3)
LIVE_SETTINGS = ("async_batching", "num_slots", "cuda_graphs", "sentinel_sample_every",
                 "max_num_batched_tokens")
MAX_BLOCK_SIZE = 256  # tokens per KV block; larger blocks only waste cache (vLLM's top: 256)
REPO_ROOT = Path(__file__).resolve().parents[1]  # the default model folder is relative to it


@dataclass(slots=True)
class EngineConfig:
    """Every engine knob; config.yaml documents each one."""

    model: str = "models/SmolLM2-135M-Instruct"
    tokenizer: str | None = None
    trust_remote_code: bool = False
    device: str = "auto"
    dtype: str = "auto"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_model_len: int | None = None
    block_size: int = 16
    num_blocks: int | None = None
    gpu_memory_fraction: float = 0.85
    prefix_caching: bool = True
    seed: int = 0
    attention_backend: str = "auto"
    model_impl: str = "auto"
    decode_layer: str = "cublas"
    fused_rotary: bool = True
    fused_pdl: bool = False
    pdl_overlap: str = "prefetch"
    gemm_table: str | None = None
    blas_library: str = "auto"
    tensor_parallel_size: int = 1
    torch_compile: bool = False
    async_batching: bool = True
    num_slots: int = 2
    cuda_graphs: bool = True
    graph_buckets: list[int] | None = None
    telemetry: bool = True
    kernel_sample_period_s: float = 10.0
    nvml_interval_s: float = 0.25
    http_port: int | None = None
    sentinel_sample_every: int = 0

    @classmethod
    def from_dict(cls, values: dict[str, Any], **overrides: Any) -> EngineConfig:
        merged = {**values, **overrides}
        allowed = [f.name for f in dataclasses.fields(cls)]
        for key in merged:
            if key in RETIRED_KEYS:
                raise ValueError(RETIRED_KEYS[key])
            if key not in allowed:
                raise ValueError(
                    f"unknown engine setting {key!r}; allowed settings: {', '.join(allowed)}"
                )
        cfg = cls(**merged)
        cfg.validate()
        return cfg

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> EngineConfig:
        path = Path(path)
        if path.is_dir():
            raise ValueError(f"config file {str(path)!r} is a directory; give the YAML file "
                             f"itself (e.g. {str(path / 'config.yaml')!r})")
        if not path.is_file():
            raise ValueError(f"config file {str(path)!r} does not exist")
        values = load_yaml(path)
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a mapping of setting: value at the top level")
        if "model" not in values and "model" not in overrides:
            values["model"] = default_model(path)
        model = values.get("model")
        if isinstance(model, str) and not Path(model).is_absolute():
            # A relative model folder is relative to the config file (if it exists there).
            beside = path.parent / model
            if beside.is_dir():
                values["model"] = str(beside)
        return cls.from_dict(values, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        _check_type("model", self.model, str)
        if not self.model:
            raise ValueError("model must be a local folder or a hub id, got an empty string")
        if self.tokenizer is not None:
            _check_type("tokenizer", self.tokenizer, str)
        _check_type("trust_remote_code", self.trust_remote_code, bool)
        _check_choice("device", self.device, DEVICES)
        _check_choice("dtype", self.dtype, DTYPES)
        _check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        _check_choice("model_impl", self.model_impl, MODEL_IMPLS)
        _check_choice("decode_layer", self.decode_layer, DECODE_LAYERS)
        _check_type("fused_rotary", self.fused_rotary, bool)
        _check_type("fused_pdl", self.fused_pdl, bool)
        _check_choice("pdl_overlap", self.pdl_overlap, PDL_OVERLAPS)
        if self.gemm_table is not None:
            _check_type("gemm_table", self.gemm_table, str)
            if not Path(self.gemm_table).is_file():
                raise ValueError(f"gemm_table must be null (the shipped engine/model/"
                                 f"gemm_table.json) or a table file written by `python -m bench "
                                 f"fused-sweep`; {self.gemm_table!r} is not a file")
        _check_choice("blas_library", self.blas_library, BLAS_LIBRARIES)
        _check_int("tensor_parallel_size", self.tensor_parallel_size, 1)
        if self.tensor_parallel_size > 1 and self.model_impl == "transformers":
            raise ValueError(
                f"tensor_parallel_size={self.tensor_parallel_size} needs our fused Llama-family "
                "path, but model_impl is 'transformers'; use model_impl 'auto' or 'gapless', or "
                "tensor_parallel_size 1"
            )
        _check_type("torch_compile", self.torch_compile, bool)
        if self.torch_compile and self.model_impl == "gapless":
            raise ValueError(
                "torch_compile compiles transformers' modeling code; it needs model_impl "
                "'transformers' or 'auto' (which compiles only models the fused path does not "
                "cover), not 'gapless'"
            )
        _check_int("max_num_seqs", self.max_num_seqs, 1)
        _check_int("max_num_batched_tokens", self.max_num_batched_tokens, 1)
        if self.max_model_len is not None:
            _check_int("max_model_len", self.max_model_len, 2)
        _check_type("prefix_caching", self.prefix_caching, bool)
        _check_int("block_size", self.block_size, 1)
        if self.block_size & (self.block_size - 1) or self.block_size > MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be a power of two from 1 to {MAX_BLOCK_SIZE}, "
                             f"got {self.block_size}")
        if self.num_blocks is not None:
            _check_int("num_blocks", self.num_blocks, 2)
        _check_type("gpu_memory_fraction", self.gpu_memory_fraction, (int, float))
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise ValueError(
                f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}"
            )
        _check_int("seed", self.seed, 0)
        if self.seed > INT32_MAX:
            raise ValueError(f"seed must be an integer in [0, {INT32_MAX}], got {self.seed}")
        for key in LIVE_SETTINGS:
            check_live_setting(key, getattr(self, key))
        if self.graph_buckets is not None:
            if not isinstance(self.graph_buckets, list) or not self.graph_buckets:
                raise ValueError("graph_buckets must be a non-empty list of positive integers")
            for b in self.graph_buckets:
                _check_int("graph_buckets entry", b, 1)
                if b > self.max_num_batched_tokens:
                    raise ValueError(
                        f"graph_buckets entry {b} is above max_num_batched_tokens="
                        f"{self.max_num_batched_tokens}: a step never has more tokens than "
                        "that, so the graph would never run; give buckets <= "
                        f"{self.max_num_batched_tokens}"
                    )
        _check_type("telemetry", self.telemetry, bool)
        _check_type("kernel_sample_period_s", self.kernel_sample_period_s, (int, float))
        if not (self.kernel_sample_period_s == 0 or 0.05 <= self.kernel_sample_period_s
                < math.inf):
            raise ValueError("kernel_sample_period_s must be 0 (no kernel sampling) or a "
                             f"number of seconds >= 0.05, got {self.kernel_sample_period_s}")
        _check_type("nvml_interval_s", self.nvml_interval_s, (int, float))
        if not (0 < self.nvml_interval_s < math.inf):  # also rejects NaN
            raise ValueError(
                f"nvml_interval_s must be a finite number > 0, got {self.nvml_interval_s}"
            )
        if self.http_port is not None and (
                isinstance(self.http_port, bool) or not isinstance(self.http_port, int)
                or not 1 <= self.http_port <= 65535):
            raise ValueError(f"http_port must be null (no HTTP API) or a port 1-65535, got "
                             f"{self.http_port!r}")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling and stop settings, named as in vLLM.

    temperature 0 means greedy. top_k -1 disables top-k; top_p 1.0 disables top-p.
    seed makes a sampled request reproducible whatever else runs beside it.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] | None = None
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    detokenize: bool = True  # False: token ids only (benchmarks); no text, no stop strings

    @classmethod
    def coerce(cls, params: SamplingParams | dict[str, Any] | None) -> SamplingParams:
        if params is None:
            return cls()
        if isinstance(params, cls):
            return params
        if isinstance(params, dict):
            allowed = [f.name for f in dataclasses.fields(cls)]
            for key in params:
                if key not in allowed:
                    raise ValueError(
                        f"unknown sampling parameter {key!r}; allowed: {', '.join(allowed)}"
                    )
            return cls(**params)
        raise ValueError(
            f"sampling params must be SamplingParams, a dict or None, got {type(params).__name__}"
        )

    def validate(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int) or not (
                1 <= self.max_tokens <= INT32_MAX):
            raise ValueError(
                f"max_tokens must be an integer in [1, {INT32_MAX}], got {self.max_tokens!r}"
            )
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number >= 0, got {self.temperature!r}")
        if not 0 <= self.temperature <= FLOAT32_MAX:  # also rejects NaN and inf
            raise ValueError(
                f"temperature must be >= 0 and finite (0 means greedy), got {self.temperature}"
            )
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or not (
                self.top_k == -1 or 1 <= self.top_k <= INT32_MAX):
            raise ValueError(
                f"top_k must be -1 (off) or an integer in [1, {INT32_MAX}], got {self.top_k!r}"
            )
        if isinstance(self.top_p, bool) or not isinstance(self.top_p, (int, float)):
            raise ValueError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
            or not 0 <= self.seed <= INT32_MAX
        ):
            raise ValueError(
                f"seed must be None or an integer in [0, {INT32_MAX}], got {self.seed!r}"
            )
        if self.stop is not None:
            if isinstance(self.stop, str):
                raise ValueError(
                    f"stop must be a list of strings, got the string {self.stop!r} "
                    "(write stop=[...])"
                )
            if not isinstance(self.stop, (list, tuple)) or not all(
                isinstance(s, str) and s for s in self.stop
            ):
                raise ValueError(
                    f"stop must be a list of non-empty strings, got {self.stop!r}"
                )
            if len(self.stop) > MAX_STOP_STRINGS:
                raise ValueError(f"stop holds {len(self.stop)} strings; at most "
                                 f"{MAX_STOP_STRINGS} are allowed")
            longest = max((len(x) for x in self.stop), default=0)
            if longest > MAX_STOP_CHARS:
                raise ValueError(f"stop holds a string of {longest} characters; at most "
                                 f"{MAX_STOP_CHARS} are allowed")
        if not isinstance(self.detokenize, bool):
            raise ValueError(f"detokenize must be true or false, got {self.detokenize!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True (they are matched on text)")
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= INT32_MAX
            for t in self.stop_token_ids
        ):
            raise ValueError(
                f"stop_token_ids must be a list of token ids (integers >= 0), got "
                f"{self.stop_token_ids!r}"
            )


class _UniqueKeyLoader(yaml.SafeLoader):
    """safe_load that refuses a mapping with the same key twice (the later one would win
    silently)."""


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"setting {key!r} is given twice; keep one", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _unique_mapping
)


def load_yaml(path: Path) -> Any:
    """The YAML document at path; ValueError naming the file, line and column when it is
    not valid YAML or UTF-8, or repeats a key. An empty file is an empty mapping."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader) or {}  # noqa: S506 (a SafeLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ValueError(f"{path}{where}: not valid YAML: {e.problem or e}") from None
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None


def check_live_setting(key: str, value: Any) -> None:
    """ValueError naming the live setting `key` and what it allows when `value` is not legal
    (the config, and every live change: Engine.configure, which also bounds the token budget
    by check_token_budget)."""
    if key in ("async_batching", "cuda_graphs"):
        _check_type(key, value, bool)
    elif key == "num_slots":
        _check_choice(key, value, NUM_SLOTS)
    elif key == "sentinel_sample_every":
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"sentinel_sample_every must be an integer >= 0 (0 = off, N = "
                             f"check 1 in N finished greedy requests), got {value!r}")
    elif key == "max_num_batched_tokens":  # a running engine's range: check_token_budget
        _check_int(key, value, 1)
    else:
        raise ValueError(f"{key!r} is not a live setting; live settings: "
                         f"{', '.join(LIVE_SETTINGS)}")


def token_budget_range(max_num_batched_tokens: int, max_num_seqs: int) -> tuple[int, int]:
    """The lowest and highest live token budget (max_num_batched_tokens) of an engine started
    with these settings. The highest is the configured value: the slots' input buffers and
    the CUDA graph buckets are sized for it at start. The lowest is max_num_seqs (or the
    configured value, if smaller): the scheduler serves running requests first, in admission
    order, and at most one of them is mid-prefill, the last; a budget of max_num_seqs gives
    every running request at least one token each step, so none stalls behind the others."""
    return min(max_num_seqs, max_num_batched_tokens), max_num_batched_tokens


def check_token_budget(value: Any, budget_range: tuple[int, int]) -> None:
    """ValueError saying what is allowed when ``value`` is not a legal live token budget for
    an engine whose token_budget_range is ``budget_range``."""
    check_live_setting("max_num_batched_tokens", value)
    low, high = budget_range
    if not low <= value <= high:
        raise ValueError(
            f"max_num_batched_tokens must be an integer from {low} to {high} while the engine "
            f"runs, got {value}: at most the {high} it was started with (its input buffers "
            "and CUDA graph buckets are sized for that; start it with a larger "
            f"max_num_batched_tokens for more), at least max_num_seqs ({low}), so every "
            "running request gets a token each step")


def _check_type(key: str, value: Any, types: type | tuple[type, ...]) -> None:
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise ValueError(f"{key} must be {_type_names(types)}, got {value!r}")
    if not isinstance(value, types):
        raise ValueError(f"{key} must be {_type_names(types)}, got {value!r}")


def _type_names(types: type | tuple[type, ...]) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    ts = types if isinstance(types, tuple) else (types,)
    return " or ".join(names.get(t, t.__name__) for t in ts)


def _check_int(key: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{key} must be an integer >= {minimum}, got {value!r}")


def _check_choice(key: str, value: Any, choices: tuple[Any, ...]) -> None:
    # Same type too: 2.0 == 2, but num_slots: 2.0 is a mistake worth naming.
    if not any(type(value) is type(c) and value == c for c in choices):
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{key} must be one of {allowed}, got {value!r}")


def default_model(config_path: Path) -> str:
    """The default model folder for a config file without ``model:``: the repository's
    models/ folder wherever the command runs (never a hub lookup of a name like
    "models/SmolLM2-135M-Instruct"); ValueError at once when it is not there."""
    default = next(f.default for f in dataclasses.fields(EngineConfig) if f.name == "model")
    for folder in (Path(default), REPO_ROOT / default):
        if folder.is_dir():
            return str(folder)
    raise ValueError(f"{config_path}: no model: set, and the default model folder {default!r} "
                     f"does not exist (here or in {REPO_ROOT}); set model: to a folder or a hub "
                     "id, or make the default with scripts/setup.sh")
