"""`[[inference.backends]]` as a config file gives it: a fleet by default, the short forms as one backend,
and every inconsistency refused with a message that names the key and what to do."""

from __future__ import annotations

from pathlib import Path

import pytest

from mcpmux.core.config import load_config
from mcpmux.errors import MuxError
from mcpmux.inference.serving.settings import BackendSettings, InferenceSettings, RemoteSettings


def inference(tmp_path: Path, text: str) -> InferenceSettings:
    config = tmp_path / "mcpmux.toml"
    config.write_text(text)
    return load_config(config).inference


def test_backends_make_a_fleet_in_the_order_given(tmp_path: Path) -> None:
    settings = inference(
        tmp_path,
        '[inference]\n[inference.models.small]\nmodel = "builtin:smollm2-135m"\n'
        '[[inference.backends]]\nbase_url = "http://gpu-a:8000/v1"\nmodels = {llama = "meta-llama/Llama-3.1-8B"}\n'
        "weight = 2.0\nmax_concurrency = 32\nrequests_per_second = 10.0\n"
        '[[inference.backends]]\nname = "b"\nbase_url = "http://gpu-b:8000/v1"\nmodels = ["llama"]\n'
        '[[inference.backends]]\nkind = "local"\nfallback = true\nmodels = {llama = "small"}\n',
    )
    assert settings.backend == "fleet"
    a, b, local = settings.fleet()
    assert (a.label, a.model_names(), a.weight, a.max_concurrency) == (
        "gpu-a:8000",
        {"llama": "meta-llama/Llama-3.1-8B"},
        2.0,
        32,
    )
    assert (b.label, b.model_names()) == ("b", {"llama": "llama"})
    assert (local.label, local.fallback, local.model_names()) == ("local", True, {"llama": "small"})


def test_the_short_forms_are_one_backend() -> None:
    assert InferenceSettings().fleet() == [BackendSettings(kind="local")]
    remote = RemoteSettings(base_url="http://gpu:8000/v1", model="m", api_key_env="KEY", timeout=5.0)
    (one,) = InferenceSettings(backend="openai", remote=remote).fleet()
    assert (one.kind, one.base_url, one.model_names(), one.api_key_env, one.timeout, one.embeddings) == (
        "openai", "http://gpu:8000/v1", {"m": "m"}, "KEY", 5.0, True,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'backend = "openai"\n[[inference.backends]]\nbase_url = "http://a/v1"\nmodels = ["m"]\n',
            'set backend = "fleet"',
        ),
        ('backend = "fleet"\n', "needs at least one [[inference.backends]]"),
        ('[[inference.backends]]\nmodels = ["m"]\n', "needs a base_url"),
        ('[[inference.backends]]\nbase_url = "http://a/v1"\n', "needs models"),
        ('[[inference.backends]]\nkind = "local"\nbase_url = "http://a/v1"\n', "a local backend runs in this process"),
        (
            '[[inference.backends]]\nbase_url = "http://a/v1"\nmodels = ["m"]\n'
            '[[inference.backends]]\nbase_url = "http://a/v1"\nmodels = ["n"]\n',
            "two [[inference.backends]] are named 'a'",
        ),
        (
            '[inference.models.x]\nmodel = "builtin:smollm2-135m"\n'
            '[[inference.backends]]\nbase_url = "http://a/v1"\nmodels = ["m"]\n',
            'no [[inference.backends]] is of kind "local"',
        ),
        (
            '[inference.models.x]\nmodel = "builtin:smollm2-135m"\n'
            '[[inference.backends]]\nkind = "local"\nmodels = {m = "y"}\n',
            "the local backend serves 'y', which is not an [inference.models.*] table",
        ),
        ('[[inference.backends]]\nkind = "local"\nweight = 0\n', "greater than 0"),
    ],
)
def test_inconsistent_fleets_are_refused_by_name(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(MuxError) as caught:
        inference(tmp_path, "[inference]\n" + text)
    assert message in str(caught.value)
    assert "mcpmux.toml" in str(caught.value)
