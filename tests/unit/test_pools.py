"""Pool configuration: the shipped file, environment overrides and the errors people will hit."""
from __future__ import annotations

from pathlib import Path

import pytest

from infra.config.pools import PoolConfig, PoolConfigError, UnknownPoolError, load_pools, pool_config, stand_ins_for
from infra.config.settings import Settings
from infra.local.model import MODEL_NAME


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings().with_(cache_dir=tmp_path / "cache")


def _load(settings: Settings, environ: dict[str, str], *, on_gpu: bool) -> dict[str, PoolConfig]:
    """The pools a process started with ``environ`` reads (its Settings come from that environment)."""
    return load_pools(Settings.from_env(environ).with_(cache_dir=settings.cache_dir), on_gpu=on_gpu)


def test_shipped_file_has_honest_cpu_defaults(settings: Settings) -> None:
    pools = _load(settings, {}, on_gpu=False)

    assert sorted(pools) == ["large", "small"]
    for pool in pools.values():
        assert pool.served_model_name == MODEL_NAME  # both pools say what they really serve
        assert MODEL_NAME in pool.description
        assert pool.uses_default_model
        assert pool.model_path == settings.cache_dir / "models" / MODEL_NAME
        assert (pool.max_model_len, pool.kv_cache_gib, pool.max_num_batched_tokens) == (2048, 1.0, 256)
        assert pool.enforce_eager and pool.enable_prefix_caching
        assert pool.scheduling_policy == "priority"
    assert (pools["large"].max_num_seqs, pools["small"].max_num_seqs) == (16, 8)


def test_eager_only_without_a_gpu(settings: Settings) -> None:
    assert not _load(settings, {}, on_gpu=True)["large"].enforce_eager


def test_env_overrides_one_field_of_one_pool(settings: Settings) -> None:
    env = {"PARLEY_POOL_LARGE_MAX_SEQS": "32", "PARLEY_POOL_SMALL_ENFORCE_EAGER": "false",
           "PARLEY_POOL_SMALL_KV_CACHE_GIB": "0.5", "PARLEY_POOL_SMALL_STREAM_INTERVAL": "3",
           "PARLEY_POOL_SMALL_FLUSH_GROUPS": "3"}
    pools = _load(settings, env, on_gpu=False)

    assert pools["large"].max_num_seqs == 32
    assert pools["small"].max_num_seqs == 8
    assert pools["small"].enforce_eager is False and pools["large"].enforce_eager is True
    assert pools["small"].kv_cache_bytes == 2**29
    assert (pools["small"].stream_interval, pools["large"].stream_interval) == (3, _load(settings, {}, on_gpu=False)[
        "large"].stream_interval)
    assert (pools["small"].flush_groups, pools["large"].flush_groups) == (3, 2)


def test_pools_file_from_env_and_relative_model_dir(settings: Settings, tmp_path: Path) -> None:
    path = tmp_path / "pools.toml"
    path.write_text('[defaults]\nmax_model_len = 4096\n\n'
                    '[pools.gpu-big]\nmodel_dir = "models/big"\nserved_model_name = "Big"\nmax_num_seqs = 64\n')
    pools = _load(settings, {"PARLEY_POOLS_FILE": str(path), "PARLEY_POOL_GPU_BIG_MAX_MODEL_LEN": "8192"},
                       on_gpu=True)

    big = pools["gpu-big"]
    assert big.model_path == tmp_path / "models" / "big" and not big.uses_default_model
    assert (big.max_model_len, big.max_num_seqs, big.served_model_name) == (8192, 64, "Big")


def test_unknown_pool_lists_the_valid_ones(settings: Settings) -> None:
    pools = _load(settings, {}, on_gpu=False)

    with pytest.raises(UnknownPoolError) as err:
        pool_config("huge", pools)
    assert err.value.valid == ["large", "small"]
    assert "unknown pool 'huge'; valid pools: large, small" in str(err.value)


def test_env_naming_an_unknown_pool_is_refused(settings: Settings) -> None:
    with pytest.raises(UnknownPoolError, match="unknown pool 'huge'.*PARLEY_POOL_HUGE_MAX_SEQS"):
        _load(settings, {"PARLEY_POOL_HUGE_MAX_SEQS": "4"}, on_gpu=False)


@pytest.mark.parametrize(("env", "message"), [
    ({"PARLEY_POOL_LARGE_MAXSEQS": "4"}, "unknown field 'MAXSEQS'"),
    ({"PARLEY_POOL_LARGE_MAX_SEQS": "lots"}, r"pool 'large'.*Expected `int`"),
    ({"PARLEY_POOL_LARGE_SCHEDULING_POLICY": "lottery"}, r"scheduling_policy"),
    ({"PARLEY_POOL_LARGE_MAX_SEQS": "0"}, "must be positive"),
    ({"PARLEY_POOL_LARGE_STREAM_INTERVAL": "-1"}, "stream_interval is a count of tokens"),
    ({"PARLEY_POOL_LARGE_FLUSH_GROUPS": "0"}, "flush_groups is how many groups"),
])
def test_bad_values_name_the_pool_and_field(settings: Settings, env: dict[str, str], message: str) -> None:
    with pytest.raises(PoolConfigError, match=message):
        _load(settings, env, on_gpu=False)


@pytest.mark.parametrize(("text", "message"), [
    ("[defaults]\nmax_model_len = 1\n", "no \\[pools.<name>\\] table"),
    ("[pools.a\n", "not valid TOML"),
    ('[pools.a]\nserved_model_name = "x"\nmax_num_seqs = 1\ncolour = "red"\n', "unknown field `colour`"),
])
def test_bad_files_are_explained(settings: Settings, tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "pools.toml"
    path.write_text(text)

    with pytest.raises(PoolConfigError, match=message):
        _load(settings, {"PARLEY_POOLS_FILE": str(path)}, on_gpu=False)


def test_missing_file_is_explained(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(PoolConfigError, match="does not exist"):
        _load(settings, {"PARLEY_POOLS_FILE": str(tmp_path / "nope.toml")}, on_gpu=False)


def test_large_declares_small_compatible_and_small_workers_stand_in_for_it(settings: Settings) -> None:
    pools = _load(settings, {}, on_gpu=False)

    assert pools["large"].compatible == ("small",) and pools["small"].compatible == ()
    assert stand_ins_for(pools, "small") == ["large"] and stand_ins_for(pools, "large") == []


COMPATIBLE = '[defaults]\nmax_num_seqs = 1\nserved_model_name = "m"\n\n[pools.a]\ncompatible = ["b"]\n\n[pools.b]\n'


@pytest.mark.parametrize(("b", "message"), [
    ("", None),  # the same model, tokenizer and context: accepted
    ("max_model_len = 4096\n", None),  # a longer context holds every prompt a admits
    ('served_model_name = "other"\n', "these differ: served_model_name"),
    ('model_dir = "elsewhere"\n', "these differ: model_dir"),
    ('engine = "sim"\n', "these differ: engine"),
    ("max_model_len = 1024\n", "context of 1024 tokens, shorter than this pool's 2048"),
])
def test_a_compatible_pool_must_serve_the_same_model_with_room_for_the_prompts(
        settings: Settings, tmp_path: Path, b: str, message: str | None) -> None:
    path = tmp_path / "pools.toml"
    path.write_text(COMPATIBLE + b)
    if message is None:
        assert stand_ins_for(_load(settings, {"PARLEY_POOLS_FILE": str(path)}, on_gpu=False), "b") == ["a"]
        return
    with pytest.raises(PoolConfigError, match=f"pool 'a'.*compatible pool 'b' .*{message}"):
        _load(settings, {"PARLEY_POOLS_FILE": str(path)}, on_gpu=False)


@pytest.mark.parametrize(("names", "message"), [('["c"]', "names 'c', which is no pool; pools: a, b"),
                                                ('["a"]', "names 'a', which is the pool itself")])
def test_compatible_names_another_pool_that_exists(settings: Settings, tmp_path: Path, names: str,
                                                   message: str) -> None:
    path = tmp_path / "pools.toml"
    path.write_text(COMPATIBLE.replace('["b"]', names))
    with pytest.raises(PoolConfigError, match=message):
        _load(settings, {"PARLEY_POOLS_FILE": str(path)}, on_gpu=False)
