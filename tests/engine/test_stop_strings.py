"""Stop strings that span token boundaries (moe/engine/sequence.py), on a byte tokenizer where
every character is its own token, so a stop string of n characters always spans n tokens."""

from moe.engine.sampling.sampler import SamplingParams
from moe.engine.sequence import Sequence


def feed(tok, text, stop):
    """Append `text`'s tokens one by one as the engine does; returns the sequence and the text
    streamed after each token."""
    seq = Sequence("r", None, [5], SamplingParams(stop=stop, max_tokens=64), 0.0)
    streamed = []
    for t in tok.encode(text):
        seq.token_ids.append(t)
        seq.detokenize(tok)
        streamed.append(seq.take_delta()[0])
        if seq.is_finished:
            break
    return seq, streamed


def test_a_stop_string_across_three_tokens_stops_and_is_cut(tokenizer_cls):
    """Rules out matching the stop string inside the newest token's text only (never true here:
    each token is one character) and searching only the text committed this step (the stop's
    first characters arrived two steps earlier)."""
    seq, streamed = feed(tokenizer_cls(), "ab cXY def", ["cXY"])
    assert seq.is_finished and seq.finish_reason == "stop" and seq.stop_reason == "cXY"
    assert seq.text == "ab " and seq.num_output_tokens == 6  # stopped on "Y", the 6th token
    # Rules out streaming without a hold-back: "c" and "cX" might start the stop string, so they
    # are never streamed; the stream is exactly the final text.
    assert "".join(streamed) == "ab " and not any("c" in s for s in streamed)


def test_the_earliest_stop_in_the_text_wins(tokenizer_cls):
    """Two stop strings complete on the same token ("d"): the text is cut at the one that starts
    first in the text ("abcd" at 0). Rules out list order (the first listed that appears, "cd",
    would leave "ab")."""
    seq, _ = feed(tokenizer_cls(), "abcdef", ["cd", "abcd"])
    assert seq.text == "" and seq.stop_reason == "abcd"
