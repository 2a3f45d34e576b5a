from dataclasses import fields

import pytest

from lynx.codec import CodecSpec
from lynx.config import MODES, LynxConfig
from lynx.options import options


def test_defaults_are_lynx_mode_with_int8_preset():
    config = LynxConfig()
    assert (config.mode, config.preset) == ("lynx", "int8")
    assert config.wire.spec == CodecSpec.preset("int8")


@pytest.mark.parametrize("field,value", [("mode", "fp8"), ("preset", "int3")])
def test_unknown_values_raise_value_error_naming_the_flag(field, value):
    with pytest.raises(ValueError, match=f"--lynx-{field}"):
        LynxConfig(**{field: value})


def test_option_table_covers_every_config_field_with_its_default():
    table = {opt.field: opt for opt in options()}
    assert set(table) == {f.name for f in fields(LynxConfig)}
    assert table["mode"].choices == MODES
    assert table["preset"].choices is None  # names or custom stage widths
    for opt in options():
        assert opt.default == getattr(LynxConfig(), opt.field)
        assert opt.flag == "--lynx-" + opt.field.replace("_", "-")


def test_preset_accepts_custom_stage_widths():
    assert LynxConfig(preset="2+6").wire.spec.stage_bits == (2, 6)
    with pytest.raises(ValueError, match="stage widths"):
        LynxConfig(preset="2+x")


def test_a_short_secret_is_refused_naming_where_it_came_from(tmp_path, monkeypatch):
    short = tmp_path / "secret"
    short.write_text("x")
    with pytest.raises(ValueError, match="has 1 bytes; use at least 16"):
        LynxConfig(secret_file=str(short)).load_secret()
    monkeypatch.setenv("LYNX_SECRET", "abc")
    with pytest.raises(ValueError, match="LYNX_SECRET"):
        LynxConfig().load_secret()
    monkeypatch.setenv("LYNX_SECRET", "a" * 32)
    assert LynxConfig().load_secret() == b"a" * 32
