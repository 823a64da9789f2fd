"""bench/build_flashattention3.py's host-side pieces: which switches and units a build of
some head dims gets, the config module its interface reads, and the MHA-only rewrite of
the backward dispatch's switches (on stand-in source text)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import build_flashattention3 as build  # noqa: E402


def test_only_unasked_head_dims_are_disabled():
    macros = build.disabled_macros([64, 256])
    assert "FLASHATTENTION_DISABLE_HDIM128" in macros
    assert "FLASHATTENTION_DISABLE_HDIM96" in macros and "FLASHATTENTION_DISABLE_HDIM192" in macros
    assert "FLASHATTENTION_DISABLE_HDIM64" not in macros and "FLASHATTENTION_DISABLE_HDIM256" not in macros
    # The backward is switched off only when asked: it is what the sweep compares.
    assert "FLASHATTENTION_DISABLE_BACKWARD" not in macros
    assert "FLASHATTENTION_DISABLE_FP8" in macros and "FLASHATTENTION_DISABLE_VARLEN" in macros


def test_config_module_matches_the_macros():
    namespace = {}
    exec(build.config_module([128]), namespace)
    flags = namespace["CONFIG"]["build_flags"]
    assert flags["FLASHATTENTION_DISABLE_HDIM128"] is False
    assert flags["FLASHATTENTION_DISABLE_HDIM64"] is True
    assert flags["FLASHATTENTION_DISABLE_BACKWARD"] is False
    assert flags["FLASHATTENTION_DISABLE_FP16"] is True
    assert set(flags) >= {f"FLASHATTENTION_DISABLE_{name}" for name in build.CONFIG_SWITCHES}


def test_sources_are_one_forward_and_one_backward_unit_per_head_dim(tmp_path):
    units = [p.relative_to(tmp_path).as_posix() for p in build.sources(tmp_path, [64, 256])]
    assert units == [
        "flash_api_stable.cpp",
        "flash_prepare_scheduler.cu",
        "instantiations/flash_fwd_hdim64_bf16_sm90.cu",
        "instantiations/flash_bwd_hdim64_bf16_sm90.cu",
        "instantiations/flash_fwd_hdim256_bf16_sm90.cu",
        "instantiations/flash_bwd_hdim256_bf16_sm90.cu",
    ]


def test_fp8_adds_an_e4m3_forward_unit_per_head_dim_and_keeps_fp8_on(tmp_path):
    units = [p.relative_to(tmp_path).as_posix() for p in build.sources(tmp_path, [128], fp8=True)]
    assert units[2:] == [
        "instantiations/flash_fwd_hdim128_bf16_sm90.cu",
        "instantiations/flash_bwd_hdim128_bf16_sm90.cu",
        "instantiations/flash_fwd_hdim128_e4m3_sm90.cu",
    ]
    assert "FLASHATTENTION_DISABLE_FP8" not in build.disabled_macros([128], fp8=True)
    assert "FLASHATTENTION_DISABLE_VARLEN" in build.disabled_macros([128], fp8=True)
    namespace = {}
    exec(build.config_module([128], fp8=True), namespace)
    assert namespace["CONFIG"]["build_flags"]["FLASHATTENTION_DISABLE_FP8"] is False


def test_forward_only_drops_the_backward_units_and_switches_it_off(tmp_path):
    units = [p.relative_to(tmp_path).as_posix() for p in build.sources(tmp_path, [128], fp8=True, forward_only=True)]
    assert units[2:] == [
        "instantiations/flash_fwd_hdim128_bf16_sm90.cu",
        "instantiations/flash_fwd_hdim128_e4m3_sm90.cu",
    ]
    assert "FLASHATTENTION_DISABLE_BACKWARD" in build.disabled_macros([128], forward_only=True)
    namespace = {}
    exec(build.config_module([128], forward_only=True), namespace)
    assert namespace["CONFIG"]["build_flags"]["FLASHATTENTION_DISABLE_BACKWARD"] is True


STAND_IN = """#pragma once
void dispatch(Params &params) {
    BOOL_SWITCH(params.h != params.h_k, GQA, [&] {
        BOOL_SWITCH(params.deterministic, Det_, [&] {
            run<GQA, Det_>(params);
        });
    });
    BOOL_SWITCH(params.is_causal, Causal, [&] { other<Causal>(params); });
}
"""


def test_mha_only_fixes_both_switches_and_leaves_the_others():
    text, count = build.mha_only(STAND_IN)
    assert count == 2
    assert text.startswith("#define YARDSTICK_FALSE_SWITCH")
    assert "YARDSTICK_FALSE_SWITCH(GQA, [&] {" in text
    assert "YARDSTICK_FALSE_SWITCH(Det_, [&] {" in text
    assert "BOOL_SWITCH(params.is_causal, Causal," in text
    # Only opening tokens change: every brace and parenthesis of the source stays.
    for ch in "{}()":
        assert text.count(ch) - build.FALSE_SWITCH.count(ch) == STAND_IN.count(ch)


def test_mha_only_leaves_a_source_without_the_switches_alone():
    text, count = build.mha_only("int main() { return 0; }\n")
    assert count == 0
    assert text == "int main() { return 0; }\n"


@pytest.mark.parametrize("argv, message", [
    (["--source", "/nonexistent", "--cutlass", "/nonexistent", "--out", "/tmp/x"], "--source"),
])
def test_bad_paths_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        build.parse_args(argv)
    assert message in capsys.readouterr().err


def test_varlen_keeps_its_varlen_paths_and_says_so():
    assert "FLASHATTENTION_DISABLE_VARLEN" not in build.disabled_macros([128], varlen=True)
    assert "FLASHATTENTION_DISABLE_PAGEDKV" in build.disabled_macros([128], varlen=True)
    namespace = {}
    exec(build.config_module([128], varlen=True), namespace)
    assert namespace["CONFIG"]["build_flags"]["FLASHATTENTION_DISABLE_VARLEN"] is False
