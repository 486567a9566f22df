"""moe/engine/sampling/guided.py's message cleaning, exactly: added for the mutants of
docs/results/mutation/run4_features/ that test_guided.py's `match=` checks let through (a regex
search passes whatever the prefix is replaced by, and no xgrammar error has an empty message)."""

from moe.engine.sampling.guided import _clean


def test_clean_cuts_the_time_and_source_prefix_and_keeps_the_first_line():
    e = RuntimeError("[12:34:56] /project/cpp/grammar_parser.cc:87: Rule \"x\" is not defined\nstack trace")
    assert _clean(e) == 'Rule "x" is not defined'
    assert _clean(ValueError("  no prefix here\nsecond  ")) == "no prefix here"


def test_clean_names_the_exception_type_when_the_message_is_empty():
    assert _clean(ValueError("")) == "ValueError"
    assert _clean(RuntimeError("   ")) == "RuntimeError"
