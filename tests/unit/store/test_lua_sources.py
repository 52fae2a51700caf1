"""The Lua scripts as sent to Redis: a shared part is written once and taken in where a script names it."""

from __future__ import annotations

import re
from pathlib import Path

from store._scripts import script_source

LUA_DIR = Path(__file__).resolve().parents[3] / "store" / "lua"


def test_every_include_is_expanded_and_names_a_part_that_exists() -> None:
    # Given every script (the parts, named with a leading underscore, are not scripts)
    scripts = sorted(path.stem for path in LUA_DIR.glob("*.lua") if not path.stem.startswith("_"))
    for name in scripts:
        # When its source is built, then no include line is left
        source = script_source(name)
        assert "-- include:" not in source, name
        # and each part it named is in the text, once
        for part in re.findall(r"^-- include: (\w+)$", (LUA_DIR / f"{name}.lua").read_text(), re.MULTILINE):
            body = (LUA_DIR / f"{part}.lua").read_text().rstrip("\n")
            assert source.count(body) == 1, (name, part)


def test_the_clock_is_written_once_for_the_scripts_that_decide_by_time() -> None:
    users = ["admission", "model_limit_acquire", "model_limit_pause"]
    for name in users:
        assert "local function now_ms(given)" in script_source(name)
        assert "redis.call('TIME')" not in (LUA_DIR / f"{name}.lua").read_text()
