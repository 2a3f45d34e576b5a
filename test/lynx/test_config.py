from dataclasses import fields

import pytest

from lynx.codec import CodecSpec
from lynx.config import MODES, LynxConfig, options


def test_defaults_are_lynx_mode_with_int8_preset():
    config = LynxConfig()
    assert (config.mode, config.preset) == ("lynx", "int8")
    assert config.codec_spec == CodecSpec.preset("int8")


@pytest.mark.parametrize("field,value", [("mode", "fp8"), ("preset", "int3")])
def test_unknown_values_raise_value_error_naming_the_flag(field, value):
    with pytest.raises(ValueError, match=f"--lynx-{field}"):
        LynxConfig(**{field: value})


def test_option_table_covers_every_config_field_with_its_default():
    table = {opt.field: opt for opt in options()}
    assert set(table) == {f.name for f in fields(LynxConfig)}
    assert table["mode"].choices == MODES
    assert table["preset"].choices == CodecSpec.preset_names()
    for opt in options():
        assert opt.default == getattr(LynxConfig(), opt.field)
        assert opt.flag == "--lynx-" + opt.field.replace("_", "-")
