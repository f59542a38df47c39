"""Exported text: every string turnguard puts on a span, a log record or a metric point encodes
and is bounded.

Tool names, agent names, conversation and call ids, a host's end reasons and a plugin's names
come from the host and, through it, from the model: a JSON decoder hands over lone surrogates
(``json.loads('"\\udc80"')``), which no OTLP encoder can write, and one such string fails the
whole batch it is in. So each string leaves turnguard through ``export_text``: lone surrogates
become U+FFFD, a string longer than ``MAX_ID_LENGTH`` characters is cut (its last character
becomes an ellipsis), and anything that is not a string becomes its text (or, when it has none,
its type's name). ASCII strings within the bound, nearly every one, are returned as they are.
"""

from __future__ import annotations

from turnguard._model import CUT_MARK, MAX_ID_LENGTH, cut_text

__all__ = ["CUT_MARK", "export_text"]


def export_text(value: object) -> str:
    """``value`` as text that every exporter can encode, at most ``MAX_ID_LENGTH`` characters."""
    if type(value) is str:
        if value.isascii() and len(value) <= MAX_ID_LENGTH:
            return value
        text = value
    elif isinstance(value, str):
        text = str.__str__(value)  # a subclass's text, without calling its methods
    else:
        text = _text_of(value)
    text = cut_text(text)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates; a pair spelled as two code points is joined
        text = text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")
    return text


def _text_of(value: object) -> str:
    """The text of a value that is not a string: an integer's digits, else its ``str()``, else
    (a ``__str__`` that raises or returns no string) its type's name in angle brackets."""
    try:
        if isinstance(value, bool):
            return bool.__repr__(value)
        if isinstance(value, int):
            return int.__repr__(value)
        text = str(value)
        if isinstance(text, str):
            return str.__str__(text)
    except Exception:  # a host object whose text fails: its type names it
        pass
    return f"<{_type_name(value)}>"


def _type_name(value: object) -> str:
    name = type(value).__qualname__
    return str.__str__(name) if isinstance(name, str) else "object"
