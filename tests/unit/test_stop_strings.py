"""Stop strings: honoured across token boundaries, removed from the output, and text that
merely looked like a stop's beginning is released, not lost."""

from __future__ import annotations

from llmd.text.stop_strings import StopMatcher


def feed_all(matcher: StopMatcher, pieces: list[str]) -> list[str]:
    out = [matcher.feed(p) for p in pieces]
    out.append(matcher.flush())
    return out


def test_stop_split_across_pieces_is_removed_with_what_follows() -> None:
    m = StopMatcher(["</answer>"])
    out = feed_all(m, ["The answer is 4</", "ans", "wer> and more"])
    assert "".join(out) == "The answer is 4"
    assert m.stopped


def test_possible_stop_prefix_is_held_back_until_it_cannot_match() -> None:
    m = StopMatcher(["STOP"])
    assert m.feed("go ST") == "go "  # "ST" could begin "STOP": held
    assert m.feed("ART") == "START"  # it did not: released in order
    assert not m.stopped


def test_held_text_is_released_at_the_end_of_generation() -> None:
    m = StopMatcher(["\n\n"])
    assert m.feed("last line\n") == "last line"
    assert m.flush() == "\n"


def test_earliest_completed_stop_wins() -> None:
    m = StopMatcher(["world", "o w"])
    assert "".join(feed_all(m, ["hello", " world"])) == "hell"


def test_no_stops_passes_text_through_untouched() -> None:
    m = StopMatcher([])
    assert m.feed("a</") == "a</" and m.flush() == ""


def test_nothing_after_a_stop_is_emitted() -> None:
    m = StopMatcher(["x"])
    assert m.feed("abxcd") == "ab"
    assert m.feed("more") == "" and m.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    m = StopMatcher(["", "END"])
    assert "".join(feed_all(m, ["text", " END"])) == "text "
