"""Engine pools: which model each pool serves and how its vLLM engine is sized.

Read once per process from ``Settings.pools_file`` (``infra/config/pools.toml`` by default), with one field of
one pool overridable from the environment (``Settings.pool_overrides``; docs/configuration.md names the variable).
Reading the configuration never touches model weights: ``infra.local.model.ready_pool`` converts the
default model on first use.
"""
from __future__ import annotations

import shutil
import tomllib
from pathlib import Path
from typing import Any, Literal

import msgspec

from infra.config.settings import POOL_PREFIX, Settings, env_var
from schemas.errors import ParleyError

DEFAULT_FILE = Path(__file__).with_name("pools.toml")
# env suffix -> field; the names people type, not always the field's own
ENV_FIELDS = {
    "MODEL_DIR": "model_dir",
    "SERVED_MODEL_NAME": "served_model_name",
    "MAX_MODEL_LEN": "max_model_len",
    "MAX_SEQS": "max_num_seqs",
    "MAX_BATCHED_TOKENS": "max_num_batched_tokens",
    "ENFORCE_EAGER": "enforce_eager",
    "KV_CACHE_GIB": "kv_cache_gib",
    "PREFIX_CACHING": "enable_prefix_caching",
    "SCHEDULING_POLICY": "scheduling_policy",
    "DTYPE": "dtype",
    "METRICS_PORT": "metrics_port",
    "ENGINE": "engine",
    "FLUSH_MS": "flush_ms",
    "FLUSH_TOKENS": "flush_tokens",
    "FLUSH_ON_TIME": "flush_on_time",
    "FLUSH_TOGETHER": "flush_together",
    "FLUSH_DRAIN": "flush_drain",
    "FLUSH_GROUPS": "flush_groups",
    "STREAM_INTERVAL": "stream_interval",
    "ROUTING": "routing",
    "TOOL_PARSER": "tool_parser",
}


class PoolConfigError(ParleyError, ValueError):
    """The pools file or a pool override variable is wrong; the message names which and why."""


class UnknownPoolError(PoolConfigError, LookupError):
    def __init__(self, name: str, valid: list[str], source: str) -> None:
        self.name, self.valid = name, valid
        super().__init__(f"unknown pool {name!r}; valid pools: {', '.join(valid)} (from {source})")


class SimConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The simulated engine's replica (``engine = "sim"``), in the capacity model's terms (``parley capacity``).

    A decode step reads the weights once plus the KV cache of every sequence in the batch at the memory
    bandwidth (18 ms alone, 36 ms at 183 sequences of 2,500 tokens with these defaults); prefill costs
    ``prefill_s_per_1k`` per 1,000 tokens on top of the step it rides in.
    """

    weights_gb: float = 140.0
    hbm_tb_per_s: float = 8.0
    kv_kb_per_token: float = 320.0  # binary KB, as the capacity model
    free_gb: float = 150.0  # memory for the KV cache: 150 GB / 320 KiB = 457,763 tokens
    block_size: int = 16
    prefill_s_per_1k: float = 0.14
    prefill_chunk: int = 256  # prompt tokens per sequence per step; 0: a whole prompt in one step
    prefill: Literal["mixed", "disaggregated"] = "mixed"  # disaggregated: a prefill replica hands over the KV
    transfer_gb_per_s: float = 50.0  # the hand-over's network, disaggregated only
    reply_tokens: int = 640  # mean reply length when the request's max_tokens allows it
    seed: int = 0

    @property
    def cache_tokens(self) -> int:
        return int(self.free_gb * 1e9 / (self.kv_kb_per_token * 1024))


class PoolConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    model_dir: str  # absolute; the converted SmolLM2 folder unless configured
    uses_default_model: bool
    served_model_name: str
    max_num_seqs: int
    max_model_len: int = 2048
    max_num_batched_tokens: int = 256
    enforce_eager: bool = True
    kv_cache_gib: float = 2.0
    enable_prefix_caching: bool = True
    scheduling_policy: Literal["priority", "fcfs"] = "priority"
    dtype: str = "bfloat16"
    description: str = ""
    metrics_port: int = 0  # the worker's fixed /metrics port (0: any free one); one worker per pool per host
    # A generation's tokens become one chat.tokens record per flush window or per flush_tokens, whichever
    # first (the first token, the finish and a cancel at once); 0: a record per engine output.
    flush_ms: float = 100.0
    flush_tokens: int = 16
    # true: the worker's clock flushes a reply once its window has passed, even mid-step (a long prefill step
    # does not hold the tokens made before it); false: only when the reply's next output arrives.
    flush_on_time: bool = True
    # true: the clock flushes the worker's replies in flush_groups groups, one a tick, each a window apart (a
    # Kafka request a tick, not one per reply's window); false: each reply once its own window has passed (a
    # tick every 10 ms).
    flush_together: bool = True
    # true (with flush_together): each reply's loop takes what the engine made for it at its group's tick, or at
    # once when it finishes, not at every engine step: the worker wakes once a window per reply, not once a step
    # (the engine joins a reply's outputs meanwhile, as vLLM's collector merges unread ones).
    flush_drain: bool = True
    # With flush_together: the replies fall into this many groups, one flushed a tick (window / flush_groups
    # apart). Each tick is a Kafka produce request and a fetch for every gateway reading the topic.
    flush_groups: int = 2
    # The engine hands the worker a reply's tokens every stream_interval tokens (its first and its last at once),
    # as vLLM's --stream-interval: the worker wakes, counts and checks once per hand-over, not once per token.
    # 0: as many as the engine's recent pace fits in half the flush window when the reply starts (for an engine
    # whose step stays well under the window: a reply keeps its interval while the batch and its step grow).
    stream_interval: int = 1
    engine: Literal["vllm", "sim"] = "vllm"  # sim: the simulated engine, for load tests and capacity planning
    sim: SimConfig = SimConfig()  # read only when engine = "sim"
    # "hermes": the model writes <tool_call> JSON blocks when it decides to call a function (tool_choice auto);
    # "": it was not set up to, and auto is refused on this pool.
    tool_parser: Literal["", "hermes"] = ""
    # How the scheduler picks a replica (consumers/scheduler/placement.py): random, conversation (consistent
    # hashing with bounded loads) or cache-aware (the replica holding most of the prompt, mixed with its queue).
    routing: Literal["random", "conversation", "cache-aware"] = "conversation"
    # Pools whose workers may take this pool's generations over once none of its own replicas is left
    # (consumers/generation/standin.py): they must serve the same model with the same tokenizer (model folder,
    # served name, engine) and a context at least as long, so a reply resumed there reads the same token ids.
    compatible: tuple[str, ...] = ()

    @property
    def tool_choices(self) -> tuple[str, ...]:
        """The ``tool_choice`` modes this pool honours: ``required`` and a named function need structured
        outputs (vLLM's guided decoding; the simulated engine has none), ``auto`` a tool parser."""
        if self.engine == "sim":
            return ("none",)
        return ("none", "required", "named") + (("auto",) if self.tool_parser else ())

    def honours(self, tool_call: str | None) -> bool:
        """Whether a reply read for calls in this form (``Sampling.tool_call``) may be written here."""
        if tool_call is None:
            return True
        return ("named" if tool_call == "json" else "auto") in self.tool_choices

    @property
    def model_path(self) -> Path:
        return Path(self.model_dir)

    @property
    def kv_cache_bytes(self) -> int:
        return int(self.kv_cache_gib * 2**30)

    @property
    def held_requests(self) -> int:
        """Requests one worker holds at once: a few more than the engine runs wait inside it, so a finished
        sequence's slot is refilled in the engine's next step instead of after a Kafka fetch (the engine's
        priority keeps paid first). The scheduler counts the same slots to place a request in the queue."""
        return self.max_num_seqs + max(1, self.max_num_seqs // 8)


def load_pools(settings: Settings, *, on_gpu: bool | None = None) -> dict[str, PoolConfig]:
    """Every pool, file values merged with environment overrides; raises PoolConfigError."""
    path = settings.pools_file
    defaults, tables = _read_file(path)
    overrides = _env_overrides(settings.pool_overrides, list(tables), str(path))
    on_gpu = shutil.which("nvidia-smi") is not None if on_gpu is None else on_gpu
    pools = {
        name: _build(name, {**defaults, **table, **overrides.get(name, {})}, settings, path, on_gpu)
        for name, table in tables.items()
    }
    for pool in pools.values():
        _check_compatible(pool, pools, path)
    return pools


def stand_ins_for(pools: dict[str, PoolConfig], pool: str) -> list[str]:
    """The pools whose generations a worker of ``pool`` may take over (those that declare it compatible)."""
    return sorted(name for name, other in pools.items() if pool in other.compatible)


def _check_compatible(pool: PoolConfig, pools: dict[str, PoolConfig], path: Path) -> None:
    """A compatible pool resumes this pool's replies from their saved token ids: the same model and tokenizer
    (model folder, served name, engine) and room for every prompt this pool admits."""
    for name in pool.compatible:
        other = pools.get(name)
        if other is None or other is pool:
            raise PoolConfigError(f"pool {pool.name!r} in {path}: compatible names {name!r}, which is "
                                  + ("the pool itself" if other is pool else
                                     f"no pool; pools: {', '.join(sorted(pools))}"))
        differ = [field for field in ("model_dir", "served_model_name", "engine")
                  if getattr(other, field) != getattr(pool, field)]
        if differ:
            raise PoolConfigError(f"pool {pool.name!r} in {path}: compatible pool {name!r} must serve the same "
                                  f"model with the same tokenizer, and these differ: {', '.join(differ)} (take it "
                                  "out of compatible when the pools serve different models)")
        if other.max_model_len < pool.max_model_len:
            raise PoolConfigError(f"pool {pool.name!r} in {path}: compatible pool {name!r} has a context of "
                                  f"{other.max_model_len} tokens, shorter than this pool's {pool.max_model_len}")


def pool_config(name: str, pools: dict[str, PoolConfig], source: str = str(DEFAULT_FILE)) -> PoolConfig:
    try:
        return pools[name]
    except KeyError:
        raise UnknownPoolError(name, sorted(pools), source) from None


def load_pool(name: str, settings: Settings) -> PoolConfig:
    """One pool's config; a configured (non-default) model folder must be a Hugging Face folder."""
    pool = pool_config(name, load_pools(settings), str(settings.pools_file))
    if not pool.uses_default_model and not (pool.model_path / "config.json").is_file():
        raise PoolConfigError(f"pool {name!r}: {pool.model_dir} is not a Hugging Face model folder")
    return pool


MODEL_NAME = "SmolLM2-135M-Instruct"


def default_model_dir(settings: Settings) -> Path:
    """Where the demo model is converted to (``infra.local.model``), under the cache dir."""
    return settings.cache_dir / "models" / MODEL_NAME


def _read_file(path: Path) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    try:
        raw = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise PoolConfigError(f"pools file {path} does not exist (set {env_var('POOLS_FILE')} or restore it)"
                              ) from None
    except tomllib.TOMLDecodeError as exc:
        raise PoolConfigError(f"pools file {path} is not valid TOML: {exc}") from exc
    tables = raw.get("pools") or {}
    if not isinstance(tables, dict) or not tables:
        raise PoolConfigError(f"pools file {path} declares no [pools.<name>] table")
    return dict(raw.get("defaults") or {}), tables


def _env_overrides(pairs: tuple[tuple[str, str], ...], names: list[str], source: str) -> dict[str, dict[str, str]]:
    """(<NAME>_<FIELD>, value) -> {name: {field: value}}; strict about typos."""
    by_prefix = {_env_name(name) + "_": name for name in names}
    found: dict[str, dict[str, str]] = {}
    for rest, value in pairs:
        key = env_var(POOL_PREFIX + rest)
        prefix = max((p for p in by_prefix if rest.startswith(p)), key=len, default=None)
        if prefix is None:
            field = next((f for f in ENV_FIELDS if rest.endswith("_" + f)), "")
            pool = rest[: len(rest) - len(field) - 1] if field else rest
            raise UnknownPoolError(pool.lower(), sorted(names), f"{source}; set by {key}")
        suffix = rest[len(prefix):]
        if suffix not in ENV_FIELDS:
            raise PoolConfigError(f"{key}: unknown field {suffix!r}; known: {', '.join(ENV_FIELDS)}")
        found.setdefault(by_prefix[prefix], {})[ENV_FIELDS[suffix]] = value
    return found


def _env_name(pool: str) -> str:
    return pool.upper().replace("-", "_")


def _build(name: str, merged: dict[str, Any], settings: Settings, path: Path, on_gpu: bool) -> PoolConfig:
    model_dir = str(merged.pop("model_dir", "") or "")
    if model_dir:
        resolved = (path.parent / Path(model_dir).expanduser()).resolve()
    else:
        resolved = default_model_dir(settings)
    merged.update(name=name, model_dir=str(resolved), uses_default_model=not model_dir)
    if merged.get("enforce_eager") in (None, ""):
        merged["enforce_eager"] = not on_gpu  # compiling costs ~2 min on a CPU, pays off on a GPU
    try:
        pool = msgspec.convert(merged, PoolConfig, strict=False)
    except msgspec.ValidationError as exc:
        raise PoolConfigError(f"pool {name!r} in {path} (or {env_var(POOL_PREFIX + _env_name(name))}_*): {exc}"
                              ) from exc
    if pool.max_num_seqs < 1 or pool.max_model_len < 1 or pool.kv_cache_gib <= 0:
        raise PoolConfigError(f"pool {name!r}: max_num_seqs, max_model_len and kv_cache_gib must be positive")
    if pool.stream_interval < 0:
        raise PoolConfigError(f"pool {name!r}: stream_interval is a count of tokens, or 0 for the engine's pace")
    if not 1 <= pool.flush_groups <= 32:
        raise PoolConfigError(f"pool {name!r}: flush_groups is how many groups the flush clock ticks, 1 to 32")
    sim = pool.sim
    if min(sim.weights_gb, sim.hbm_tb_per_s, sim.kv_kb_per_token, sim.free_gb, sim.transfer_gb_per_s) <= 0 \
            or sim.block_size < 1 or sim.prefill_chunk < 0 or sim.reply_tokens < 1 or sim.prefill_s_per_1k < 0:
        raise PoolConfigError(f"pool {name!r}: [pools.{name}.sim] values must be positive")
    return pool


__all__ = [
    "PoolConfig",
    "PoolConfigError",
    "SimConfig",
    "UnknownPoolError",
    "load_pool",
    "load_pools",
    "pool_config",
    "stand_ins_for",
]
