"""Folding (morphguard.folding): the spellings of a word that a reader, and a model, reads as that word are
written one way for matching; model names are compared case folded, with and without a provider prefix."""

from __future__ import annotations

import pytest

from morphguard.folding import fold, foldings, model_names

# Each way of writing "pregnant" that a reader still reads as "pregnant".
SPELLINGS = {
    "zero-width space": "preg\u200bnant",
    "soft hyphen": "preg\u00adnant",
    "word joiner and zero-width joiner": "pr\u2060eg\u200dnant",
    "Cyrillic e and a": "pr\u0435gn\u0430nt",
    "Cyrillic capitals": "\u0420R\u0415GN\u0410N\u0422",
    "Greek capitals": "\u03a1R\u0395G\u039d\u0391\u039d\u03a4",
    "Greek rho": "\u03c1regnant",
    "Greek eta for n": "preg\u03b7ant",
    "fullwidth": "ｐｒｅｇｎａｎｔ",
    "mathematical bold": "𝐩𝐫𝐞𝐠𝐧𝐚𝐧𝐭",
    "combining accent": "pre\u0301gnant",
    "HTML soft hyphen": "preg&shy;nant",
}


@pytest.mark.parametrize("spelling", SPELLINGS.values(), ids=SPELLINGS.keys())
def test_every_spelling_folds_to_the_plain_word(spelling):
    assert "is this safe while pregnant?" in foldings(f"Is this safe while {spelling}?")


def test_folding_keeps_what_is_different_and_leaves_ascii_to_lower_case():
    assert fold("Side\u2011Effects of the DRUG") == "side-effects of the drug"  # every dash is "-"
    assert fold("Straße") == "strasse"
    assert fold("\u0411\u0435\u0440\u0435\u043c\u0435\u043d\u043d\u043e\u0441\u0442\u044c") == fold(
        "\u0431\u0435\u0440\u0435\u043c\u0435\u043d\u043d\u043e\u0441\u0442\u044c")  # Russian still folds alike
    assert fold("plain ascii, Nothing else") == "plain ascii, nothing else"
    assert foldings("\u039d and \u03bd") == ["n and n", "v and v"]  # Greek N/v: read both ways, case alike


def test_model_names_are_compared_normalised_with_and_without_a_provider_prefix():
    assert model_names("openai/GPT-4o") == ("openai/gpt-4o", "gpt-4o")
    assert model_names(" ｇｐｔ-４ｏ ") == ("gpt-4o",)
    assert model_names("gpt-\u200b4o") == ("gpt-4o",)
    assert model_names("openrouter/openai/gpt-4-turbo") == ("openrouter/openai/gpt-4-turbo", "gpt-4-turbo")
